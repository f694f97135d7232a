//go:build race

package integration

// raceEnabled: this test binary runs under the race detector, and so does
// the Caddy binary it builds (see binary).
const raceEnabled = true
