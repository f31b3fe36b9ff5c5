// Package cliflag holds what ticketd and ticketctl share in reading their
// flags.
package cliflag

import (
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// parseError is the flag package's message for a value its Set refused.
var parseError = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): parse error$`)

// Explain rewrites the flag package's "parse error" for a duration flag
// into one that says what a duration looks like: most often the value is
// a bare number ("--lease 30"), which needs a unit; for a whole-number
// flag, into one that says so. Other errors come back as they are.
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
	switch g.Get().(type) {
	case time.Duration:
	case int, int64:
		return fmt.Errorf("invalid value %q for --%s: want a whole number", m[1], m[2])
	case uint, uint64:
		return fmt.Errorf("invalid value %q for --%s: want a whole number, 0 or more", m[1], m[2])
	default:
		return err
	}
	if _, err := strconv.ParseFloat(m[1], 64); err == nil {
		return fmt.Errorf("invalid value %q for --%s: want a duration with a unit, such as 30s, 500ms or 1h", m[1], m[2])
	}
	return fmt.Errorf("invalid value %q for --%s: not a duration (such as 30s, 500ms or 1h), or out of range", m[1], m[2])
}
