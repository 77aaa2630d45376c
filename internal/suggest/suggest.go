// Package suggest finds the word a mistyped one was probably meant to be,
// for the "did you mean" of an error message.
package suggest

// Closest returns the word of known nearest to typo, if it is near enough
// to be what was meant: at most a third of its letters different.
// Otherwise it returns "".
func Closest(typo string, known []string) string {
	best, bestDist := "", len(typo)/3+1
	for _, k := range known {
		if d := Distance(typo, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// Distance is the edit distance between a and b: insertions, deletions,
// substitutions and swaps of neighbours, each counting one.
func Distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
