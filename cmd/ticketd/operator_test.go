package main

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ticketd/ticketd/pprof"
)

// A replace or a change of limits ends before the admin server stops
// writing its answer, so the operator reads how it ended (and where a
// replace stopped) rather than a cut connection.
func TestOperatorCallsEndBeforeTheAdminWriteTimeout(t *testing.T) {
	ctx, cancel := operatorContext(httptest.NewRequest("POST", "/cluster/replace", nil))
	defer cancel()
	dl, ok := ctx.Deadline()
	if left := time.Until(dl); !ok || left <= 0 || left >= pprof.DefaultWriteTimeout {
		t.Fatalf("deadline in %v (set %v), want within the write timeout %v", left, ok, pprof.DefaultWriteTimeout)
	}
}
