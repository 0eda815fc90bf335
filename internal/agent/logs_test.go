package agent

import (
	"strings"
	"testing"
)

// The ring keeps the newest lines within its bytes, numbered on; a
// follower's channel is closed by the next line.
func TestLogRing(t *testing.T) {
	r := newLogRing(10)
	_, wake := r.since(0)
	r.add(1, "", "stdout", "aaaa")
	select {
	case <-wake:
	default:
		t.Fatal("a line did not wake the follower")
	}
	r.add(1, "", "stdout", "bbbb")
	r.add(1, "t", "stderr", "cccc") // 12 bytes: aaaa goes
	got, _ := r.since(0)
	if len(got) != 2 || got[0].Line != "bbbb" || got[0].Seq != 2 || got[1].Seq != 3 || got[1].Tag != "t" {
		t.Fatalf("kept %+v", got)
	}
	if got, _ := r.since(2); len(got) != 1 || got[0].Line != "cccc" {
		t.Errorf("since 2: %+v", got)
	}
	if got, _ := r.since(3); len(got) != 0 {
		t.Errorf("since the last: %+v", got)
	}
	// One line larger than the ring is kept alone, not lost.
	r.add(1, "", "stdout", strings.Repeat("x", 50))
	if got, _ := r.since(0); len(got) != 1 || got[0].Seq != 4 {
		t.Errorf("a large line: %+v", got)
	}
}

func TestLineSplitter(t *testing.T) {
	var lines []string
	s := &lineSplitter{emit: func(l string) { lines = append(lines, l) }}
	s.write([]byte("one\r\ntw"))
	s.write([]byte("o\n\nthr"))
	s.write([]byte(strings.Repeat("y", maxLogLine+1)))
	s.flush()
	want := []string{"one", "two", "", "thr" + strings.Repeat("y", maxLogLine-3), "yyyy"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d = %.20q…, want %.20q…", i, lines[i], want[i])
		}
	}
}
