package vm

import (
	"fmt"
	"testing"
)

func TestDiskLayers(t *testing.T) {
	l := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprint("l", i))
		}
		return out
	}
	for _, tc := range []struct {
		layers, disks int
		want          string
	}{
		{1, 21, "[[l0]]"},
		{3, 3, "[[l0] [l1] [l2]]"},
		{4, 3, "[[l0] [l1] [l2 l3]]"},
		{5, 1, "[[l0 l1 l2 l3 l4]]"},
		{2, 0, "[[l0 l1]]"},
	} {
		if got := fmt.Sprint(diskLayers(l(tc.layers), tc.disks)); got != tc.want {
			t.Errorf("%d layers on %d disks: %s, want %s", tc.layers, tc.disks, got, tc.want)
		}
	}
}
