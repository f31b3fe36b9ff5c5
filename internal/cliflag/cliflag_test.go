package cliflag

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the message; "" for the flag package's own
	}{
		{[]string{"--lease", "30"}, `invalid value "30" for --lease: want a duration with a unit, such as 30s`},
		{[]string{"--lease", "2.5"}, `invalid value "2.5" for --lease: want a duration with a unit`},
		{[]string{"--lease", "soon"}, `invalid value "soon" for --lease: not a duration (such as 30s, 500ms or 1h), or out of range`},
		{[]string{"--lease", "9999999999h"}, `invalid value "9999999999h" for --lease: not a duration`},
		{[]string{"--count", "x"}, `invalid value "x" for --count: want a whole number`},
		{[]string{"--id", "-1"}, `invalid value "-1" for --id: want a whole number, 0 or more`},
		{[]string{"--on=maybe"}, ""},
		{[]string{"--nope"}, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Duration("lease", time.Second, "")
		fs.Int("count", 0, "")
		fs.Bool("on", false, "")
		fs.Uint64("id", 0, "")
		err := fs.Parse(tc.args)
		if err == nil {
			t.Fatalf("%v: parsed", tc.args)
		}
		got := Explain(fs, err)
		if tc.want == "" {
			if got != err {
				t.Errorf("%v: %q rewritten to %q", tc.args, err, got)
			}
			continue
		}
		if !strings.Contains(got.Error(), tc.want) {
			t.Errorf("%v: %q, want it to contain %q", tc.args, got, tc.want)
		}
	}
}
