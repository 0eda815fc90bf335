package memstore

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestTable(t *testing.T) {
	tb := New[int]("number")
	if _, err := tb.Get("one"); !errors.Is(err, errdefs.ErrNotFound) || err.Error() != "number one: not found" {
		t.Errorf("Get of a missing record: %v", err)
	}
	for i := range 3 {
		if got := tb.Insert(func(n int) (string, int) { return fmt.Sprint(n), n * 10 }); got != i*10 {
			t.Errorf("Insert %d = %d", i, got)
		}
	}
	if !tb.Has("2") || tb.Has("3") {
		t.Error("Has is wrong after three inserts")
	}
	got := tb.List(func(v int) bool { return v > 0 })
	sort.Ints(got)
	if fmt.Sprint(got) != "[10 20]" {
		t.Errorf("List = %v", got)
	}

	refuse := errors.New("odd")
	if v, err := tb.Update("1", func(v *int) error { *v = 11; return refuse }); err != refuse || v != 10 {
		t.Errorf("refused Update = %d, %v", v, err)
	}
	if v, err := tb.Update("1", func(v *int) error { *v++; return nil }); err != nil || v != 11 {
		t.Errorf("Update = %d, %v", v, err)
	}
	if _, err := tb.Update("9", func(*int) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update of a missing record: %v", err)
	}

	if _, err := tb.Delete("1", func(int) error { return refuse }); err != refuse || !tb.Has("1") {
		t.Errorf("refused Delete: %v", err)
	}
	if v, err := tb.Delete("1", nil); err != nil || v != 11 || tb.Has("1") {
		t.Errorf("Delete = %d, %v", v, err)
	}
	if _, err := tb.Delete("1", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete of a missing record: %v", err)
	}
}
