package replica

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4/logger"
	"go.uber.org/zap"
)

// Dragonboat's loggers are process-wide and set once; they write through the
// logger of the node started last (one per process outside tests).
var (
	logOnce sync.Once
	logTo   atomic.Pointer[zap.Logger]
	// lostTo records in the data dir of the node started last that its raft
	// log has lost acknowledged entries, before Dragonboat's panic ends the
	// process (nil: no node).
	lostTo atomic.Pointer[func(why string) error]
)

func setupLogging(l *zap.Logger) {
	logTo.Store(l.Named("raft"))
	logOnce.Do(func() {
		logger.SetLoggerFactory(func(pkg string) logger.ILogger { return &dbLogger{pkg: pkg} })
		// Elections, connection failures to a stopped peer and snapshot
		// chatter are normal in a cluster's life; the node logs leadership
		// changes itself, with shard, term and node.
		for pkg, lvl := range map[string]logger.LogLevel{
			"raft": logger.ERROR, "rsm": logger.WARNING, "transport": logger.ERROR,
			"grpc": logger.ERROR, "dragonboat": logger.WARNING, "logdb": logger.WARNING,
			"raftpb": logger.ERROR, "config": logger.WARNING, "settings": logger.WARNING,
		} {
			logger.GetLogger(pkg).SetLevel(lvl)
		}
	})
}

type dbLogger struct {
	pkg   string
	level atomic.Int32
}

func (l *dbLogger) SetLevel(lv logger.LogLevel) { l.level.Store(int32(lv)) }

func (l *dbLogger) on(lv logger.LogLevel) bool { return int32(lv) <= l.level.Load() }

func (l *dbLogger) log(lv logger.LogLevel, format string, args []any) {
	if !l.on(lv) {
		return
	}
	z := logTo.Load()
	if z == nil {
		return
	}
	if l.pkg == "transport" && lv == logger.ERROR && peerDown(format) {
		// A peer down or restarting (a rolling restart among them) fails
		// its connections every second: not an error of this node's, and
		// said by each shard's leadership and the node's own readiness.
		if !transportLines.allow(format) {
			return
		}
		lv = logger.WARNING
	}
	if l.pkg == "dragonboat" && strings.HasPrefix(format, misdelivered) {
		// Said once per message: a node that the cluster still lists under
		// another id at this address gets hundreds a second (a review's
		// replacement, started at the lost node's address before the
		// replace, logged 850 lines a second).
		if transportLines.allow(format) {
			z.Warn("raft messages for another node id reach this node's raft address: the cluster lists that id here; if it lasts, this node was started at the address of a node not yet replaced (stop it, run the replace, start it again: README, replacing a node), or two nodes were given one address",
				zap.String("raft", fmt.Sprintf(format, args...)), zap.String("pkg", l.pkg))
		}
		return
	}
	msg := fmt.Sprintf(format, args...)
	f := zap.String("pkg", l.pkg)
	switch lv {
	case logger.DEBUG:
		z.Debug(msg, f)
	case logger.INFO:
		z.Info(msg, f)
	case logger.WARNING:
		z.Warn(msg, f)
	default:
		z.Error(msg, f)
	}
}

// peerDown tells a transport line about a connection to a peer that failed
// from one about this node's transport or bytes on the wire.
func peerDown(format string) bool {
	return strings.Contains(format, "failed to get a connection") || strings.HasPrefix(format, "send batch failed")
}

// misdelivered begins Dragonboat's line for a message that reached a node
// under another replica id than the one it was sent to.
const misdelivered = "ignored a %s message sent to %s but received by"

// transportLines lets each kind of transport line through once every
// transportEvery.
var transportLines = lineLimit{every: transportEvery, last: map[string]time.Time{}}

const transportEvery = 10 * time.Second

// lineLimit lets one line per format through once every every.
type lineLimit struct {
	mu    sync.Mutex
	every time.Duration
	last  map[string]time.Time
}

func (ll *lineLimit) reset() {
	ll.mu.Lock()
	clear(ll.last)
	ll.mu.Unlock()
}

func (ll *lineLimit) allow(format string) bool {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	now := time.Now()
	if t, ok := ll.last[format]; ok && now.Sub(t) < ll.every {
		return false
	}
	if len(ll.last) > 256 {
		clear(ll.last) // formats are few; bounded all the same
	}
	ll.last[format] = now
	return true
}

func (l *dbLogger) Debugf(format string, args ...any)   { l.log(logger.DEBUG, format, args) }
func (l *dbLogger) Infof(format string, args ...any)    { l.log(logger.INFO, format, args) }
func (l *dbLogger) Warningf(format string, args ...any) { l.log(logger.WARNING, format, args) }
func (l *dbLogger) Errorf(format string, args ...any)   { l.log(logger.ERROR, format, args) }
func (l *dbLogger) Panicf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if z := logTo.Load(); z != nil {
		z.Error(msg, zap.String("pkg", l.pkg))
	}
	if strings.HasPrefix(format, "inconsistent target for") {
		// Two raft addresses for one node id: the nodes were started with
		// different --peers. Dragonboat's words and stack name neither the
		// cause nor a way out (a review's typo at bootstrap ended nodes
		// this way, again at every start).
		if z := logTo.Load(); z != nil {
			z.Error("stopping: raft knows one node by two addresses: the nodes were given different --peers (a typo?); check --peers on every node against a live node's /debug/cluster. "+
				"A node that bootstrapped with a wrong list keeps it in its raft state: empty its data dir and bring it back as a replacement under a new id (README: replacing a node); "+
				"while it runs, nodes that learned its wrong address from it stop too", zap.String("raft", msg))
		}
	}
	if strings.HasPrefix(format, "invalid commitTo index") {
		// The leader knows this replica had entries its log no longer
		// holds: the node must not run on this data dir again, and each
		// start would until the leader's heartbeat came (or, after a
		// leader change, not at all). Recorded before the panic.
		werr := errors.New("no data dir to record it in")
		if f := lostTo.Load(); f != nil {
			werr = (*f)(msg)
		}
		if z := logTo.Load(); z != nil {
			z.Error("stopping: this node's raft log has lost entries it acknowledged: its data dir was restored from a copy, "+
				"or its disk lost synced writes; it must not run again: bring it back as a replacement under a new id, on an empty data dir (README: replacing a node)",
				zap.NamedError("recording_it_in_the_data_dir", werr))
		}
	}
	panic(msg)
}
