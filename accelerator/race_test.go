//go:build race

package accelerator

// raceDetector says the race detector is on, which slows kernels so much
// that timing comparisons mean nothing.
const raceDetector = true
