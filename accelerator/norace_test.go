//go:build !race

package accelerator

// raceDetector says the race detector is on (race_test.go).
const raceDetector = false
