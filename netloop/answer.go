package netloop

import (
	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

// AppendAnswer appends a's wire line to dst: the one way from the lock
// table's decisions to bytes, for every mode.
func AppendAnswer(dst []byte, a *shard.Answer) []byte {
	switch a.Result {
	case shard.Acquired:
		return codec.AppendAcquired(dst, a.Token, a.Owner, a.Key)
	case shard.TimedOut:
		return codec.AppendTimedOut(dst, a.Owner, a.Key)
	case shard.Busy:
		return codec.AppendBusy(dst, a.Owner, a.Key)
	case shard.Released:
		return codec.AppendReleased(dst, a.Token, a.Key)
	default:
		return codec.AppendNotReleased(dst, a.Token, a.Key)
	}
}
