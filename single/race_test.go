//go:build race

package single

const raceEnabled = true
