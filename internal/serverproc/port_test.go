package serverproc

import "testing"

// Picks one by one never return a port twice: with 20,000 ports to pick
// from at random, 600 picks would meet one twice almost surely (about 9 times).
func TestFreeAddrNeverReturnsAPortTwice(t *testing.T) {
	seen := make(map[string]bool)
	for range 600 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s returned twice", addr)
		}
		seen[addr] = true
	}
}
