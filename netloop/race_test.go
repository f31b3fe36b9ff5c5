//go:build race

package netloop

const raceEnabled = true
