//go:build !race

package netloop

const raceEnabled = false
