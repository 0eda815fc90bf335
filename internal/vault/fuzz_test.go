package vault

import "testing"

// FuzzReadCommands reads mutated push requests' commands.
func FuzzReadCommands(f *testing.F) {
	f.Add([]byte("00820000000000000000000000000000000000000000 1111111111111111111111111111111111111111 refs/heads/main\x00report-status side-band-64k0000PACK"))
	f.Add([]byte("0000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		readCommands(b)
	})
}
