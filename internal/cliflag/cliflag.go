// Package cliflag holds what ticketd and ticketctl share in reading their
// flags.
package cliflag

import (
	"flag"
	"fmt"
	"regexp"
	"time"
)

// parseError is the flag package's message for a value its Set refused.
var parseError = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): parse error$`)

// Explain rewrites the flag package's "parse error" for a duration flag
// (most often a bare number: "--lease 30") into a message that says a
// unit is needed. Other errors come back as they are.
func Explain(fs *flag.FlagSet, err error) error {
	m := parseError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	f := fs.Lookup(m[2])
	if f == nil {
		return err
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	if _, isDur := g.Get().(time.Duration); !isDur {
		return err
	}
	return fmt.Errorf("invalid value %q for --%s: want a duration with a unit, such as 30s, 500ms or 1h", m[1], m[2])
}
