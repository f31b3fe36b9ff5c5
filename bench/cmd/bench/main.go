// Command bench is ticketd's benchmark: `make bench` runs every scenario
// against ticketd, Redis and an echo ceiling and writes a Markdown table and a
// chart to bench/results; `bench load` is the load generator on its own. Run
// `bench -h` for the flags.
package main

import (
	"os"

	"github.com/ticketd/ticketd/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
