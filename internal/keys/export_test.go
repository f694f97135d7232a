package keys

// Len is the number of paths in the set, for the tests.
func (q *JSONPaths) Len() int { return len(q.raw) }
