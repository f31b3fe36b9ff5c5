// Command echo is the bench's ceiling: a gnet server that writes back every
// byte it reads, one write per read, with the event loops ticketd's netloop
// uses. Whatever a lock server does on top of that costs throughput, so the
// bench compares ticketd's lines/s with this one's for the same bytes.
//
//	echo --listen 127.0.0.1:0
//
// When it accepts it prints "listening <addr>" on stdout; SIGTERM or SIGINT
// stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
)

type echo struct {
	gnet.BuiltinEventEngine
	booted chan gnet.Engine
}

func (e *echo) OnBoot(eng gnet.Engine) gnet.Action {
	e.booted <- eng
	addr, err := boundAddr(eng)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return gnet.Shutdown
	}
	fmt.Printf("listening %s\n", addr)
	return gnet.None
}

func (e *echo) OnTraffic(c gnet.Conn) gnet.Action {
	buf, _ := c.Next(-1)
	_, _ = c.Write(buf) // copies or writes at once: buf is not kept
	return gnet.None
}

// boundAddr reads the address the kernel gave the listener, for port 0.
func boundAddr(eng gnet.Engine) (string, error) {
	fd, err := eng.Dup()
	if err != nil {
		return "", err
	}
	defer syscall.Close(fd)
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return "", err
	}
	if in4, ok := sa.(*syscall.SockaddrInet4); ok {
		return (&net.TCPAddr{IP: net.IP(in4.Addr[:]), Port: in4.Port}).String(), nil
	}
	if in6, ok := sa.(*syscall.SockaddrInet6); ok {
		return (&net.TCPAddr{IP: net.IP(in6.Addr[:]), Port: in6.Port}).String(), nil
	}
	return "", fmt.Errorf("unexpected listener address %T", sa)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	loops := flag.Int("loops", 0, "event loops (0: one per core)")
	flag.Parse()

	e := &echo{booted: make(chan gnet.Engine, 1)}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		eng := <-e.booted
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	}()
	err := gnet.Run(e, "tcp://"+*listen,
		gnet.WithMulticore(*loops == 0),
		gnet.WithNumEventLoop(*loops),
		gnet.WithReusePort(false),
		gnet.WithLogLevel(logging.ErrorLevel),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}
