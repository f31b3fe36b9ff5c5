package netloop

import (
	"reflect"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
)

// forgetAddrs drops what gnet keeps of a connection's addresses: the local
// and remote net.Addr it took from the accepted socket, and the remote
// socket address it parsed again from the latter's text. Nothing here
// reads them (gnet needs the socket address only for datagrams), and they
// came to about 160 of the bytes an idle connection costs, which are
// budgeted at 1 KiB. gnet's fields are not exported: they are reached by
// reflection, each cleared only if it is an interface, as the existing
// pause and unsent code reach gnet's; if gnet's layout changes, they stay
// (a test guards the layout). Loop only, in OnOpen.
func forgetAddrs(gc gnet.Conn) {
	v := reflect.ValueOf(gc)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return
	}
	for _, name := range [...]string{"localAddr", "remoteAddr", "remote"} {
		f := v.Elem().FieldByName(name)
		if !f.IsValid() || f.Kind() != reflect.Interface || !f.CanAddr() {
			continue
		}
		reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().SetZero()
	}
}
