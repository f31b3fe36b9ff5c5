package serverproc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

// given holds the ports FreeAddr returned in this process: a port closed
// again is free to a second pick, and a test that picks the addresses of
// three nodes one by one then started two on the same port.
var given struct {
	sync.Mutex
	ports map[int]bool
}

// FreeAddr returns a loopback address free now, with a port below the
// kernel's ephemeral range (32768 up on Linux): a server restarted on its
// port must not find it taken by some client's outgoing connection, which
// port 0 would allow. It never returns a port twice in a process.
func FreeAddr() (string, error) {
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = make(map[int]bool)
	}
	for range 1000 {
		port := 10000 + rand.IntN(20000)
		if given.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		ln.Close()
		given.ports[port] = true
		return addr, nil
	}
	return "", errors.New("serverproc: no free port below the ephemeral range")
}
