package memstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/testenv"
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

func TestTemplateStreams(t *testing.T) {
	var tpl api.Template
	var evs []api.ImportEvent
	if err := ImportArchive(&tpl, testenv.Tar("a", "12", "b", "345"), func(ev api.ImportEvent) { evs = append(evs, ev) }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(tpl.Layers) != "[a b]" || tpl.Size != 5 || len(evs) != 2 || evs[1].LayersDone != 2 || evs[1].Bytes != 3 {
		t.Errorf("ImportArchive: %+v, events %+v", tpl, evs)
	}
	if err := ImportArchive(&tpl, strings.NewReader(strings.Repeat("junk", 200)), nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("ImportArchive of junk: %v", err)
	}

	tpl = api.Template{}
	lines, err := BuildContext(&tpl, testenv.Tar("ci/Dockerfile", "FROM x\nRUN y\n", "main.c", ""), "ci/Dockerfile")
	if err != nil || fmt.Sprint(lines) != "[FROM x RUN y]" || fmt.Sprint(tpl.Layers) != "[ci/Dockerfile main.c]" {
		t.Errorf("BuildContext = %q, %v; layers %v", lines, err, tpl.Layers)
	}
	if _, err := BuildContext(&api.Template{}, testenv.Tar("main.c", ""), "Dockerfile"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("BuildContext without the Dockerfile: %v", err)
	}
}

func TestTemplates(t *testing.T) {
	ts := NewTemplates(api.Template{Name: "host", Source: "builtin"})
	ctx := context.Background()
	if tpl, err := ts.Tag(ctx, "host", "h2"); err != nil || tpl.Name != "h2" || tpl.Source != "builtin" {
		t.Errorf("Tag = %+v, %v", tpl, err)
	}
	if l, err := ts.List(ctx); err != nil || len(l) != 2 {
		t.Errorf("List = %+v, %v", l, err)
	}
	if _, err := ts.Get(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of a missing template: %v", err)
	}
	if _, err := ts.Tag(ctx, "nope", "x"); !errors.Is(err, errdefs.ErrNotFound) || ts.Has("x") {
		t.Errorf("Tag of a missing template: %v", err)
	}
}
