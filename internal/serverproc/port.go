package serverproc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
)

// FreeAddr returns a loopback address free now, with a port below the
// kernel's ephemeral range (32768 up on Linux): a server restarted on its
// port must not find it taken by some client's outgoing connection, which
// port 0 would allow.
func FreeAddr() (string, error) {
	for range 1000 {
		port := 10000 + rand.IntN(20000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr, nil
	}
	return "", errors.New("serverproc: no free port below the ephemeral range")
}
