//go:build !unix

package sluice

// openFileLimit is unknown here: the tarpits' ceiling is their tarpit_max.
func openFileLimit() int64 { return 0 }
