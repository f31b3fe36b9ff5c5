package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/pprof"
)

// Before the cluster node is up (its raft state loading), its operator and
// status pages exist and say so, rather than 404 as if there were none.
func TestClusterPagesAnswerStartingBeforeTheNodeIsUp(t *testing.T) {
	a := &admin{a: pprof.New(), log: zap.NewNop()}
	a.clusterPages()
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/cluster/replace?old=3&new=4&addr=127.0.0.1:1"},
		{http.MethodPost, "/cluster/limits?max_keys=1&max_waiters=1&max_waiters_per_key=1"},
		{http.MethodGet, "/debug/cluster"},
	} {
		w := httptest.NewRecorder()
		a.a.Handler().ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
		if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "starting") {
			t.Errorf("%s %s before the node is up: %d %q, want 503 saying it is starting", c.method, c.path, w.Code, w.Body.String())
		}
	}
}
