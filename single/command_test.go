package single

import (
	"reflect"
	"testing"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/internal/dirty"
	"github.com/ticketd/ticketd/shard"
)

// TestCommandSetsEveryField: command fills the batch's one Command field by
// field, so a field it forgot would keep the previous frame's value.
func TestCommandSetsEveryField(t *testing.T) {
	for _, q := range []codec.Request{
		{Kind: codec.Acquire, Owner: []byte("o"), Key: []byte("k"), LeaseMs: 1000, WaitMs: 5},
		{Kind: codec.Release, Key: []byte("k"), Token: 42},
	} {
		var clean, used shard.Command
		dirty.Fill(&used)
		command(&clean, &q, 3, 9)
		command(&used, &q, 3, 9)
		if !reflect.DeepEqual(clean, used) {
			t.Errorf("%c frame: into a zero command %+v, into a used one %+v", q.Kind, clean, used)
		}
	}
}
