//go:build !unix

package client

import "net"

// tryWriter is unavailable here: the writer goroutine does every write.
type tryWriter struct{ ok bool }

func (t *tryWriter) reset(net.Conn) {}

func (t *tryWriter) write(b []byte) ([]byte, error) { return b, nil }
