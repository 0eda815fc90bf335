package memstore

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Templates holds templates by name, with the methods of the server's
// template service that make none (List, Get, Tag), for the template
// stand-ins to embed.
type Templates struct {
	*Table[api.Template]
}

// NewTemplates holds the built-in template, host, as given.
func NewTemplates(host api.Template) Templates {
	t := Templates{New[api.Template]("template")}
	t.Put("host", host)
	return t
}

// List lists the templates, in no order.
func (t Templates) List(ctx context.Context) ([]api.Template, error) {
	return t.Table.List(nil), nil
}

// Get returns template name, or an ErrNotFound.
func (t Templates) Get(ctx context.Context, name string) (api.Template, error) {
	return t.Table.Get(name)
}

// Tag names template name tag too.
func (t Templates) Tag(ctx context.Context, name, tag string) (api.Template, error) {
	tpl, err := t.Table.Get(name)
	if err != nil {
		return tpl, err
	}
	tpl.Name = tag
	t.Put(tag, tpl)
	return tpl, nil
}

// ImportArchive reads an image archive as the template stand-ins import
// one: a layer per tar entry, named after it, added to t with its size and
// reported to progress as it is read. A stream that is not tar is an
// ErrInvalid.
func ImportArchive(t *api.Template, archive io.Reader, progress func(api.ImportEvent)) error {
	return eachEntry(archive, func(name string, body []byte) {
		n := int64(len(body))
		t.Layers = append(t.Layers, name)
		t.Size += n
		progress(api.ImportEvent{Layer: name, Bytes: n, Total: n, LayersDone: len(t.Layers)})
	}, func(err error) error {
		return fmt.Errorf("%w: not an image archive", errdefs.ErrInvalid)
	})
}

// BuildContext reads a build context as the template stand-ins build
// from one: a layer per tar entry, added to t, and the lines of the
// Dockerfile at path dockerfile, which it returns. A stream that is not
// tar, or one without the Dockerfile, is an ErrInvalid.
func BuildContext(t *api.Template, buildContext io.Reader, dockerfile string) ([]string, error) {
	var lines []string
	err := eachEntry(buildContext, func(name string, body []byte) {
		if name == dockerfile {
			lines = strings.Split(strings.TrimSpace(string(body)), "\n")
		}
		t.Layers = append(t.Layers, name)
	}, func(err error) error {
		return fmt.Errorf("%w: reading the build context: %v", errdefs.ErrInvalid, err)
	})
	if err == nil && lines == nil {
		err = fmt.Errorf("%w: no %s in the build context", errdefs.ErrInvalid, dockerfile)
	}
	return lines, err
}

// eachEntry calls f with each entry of the tar stream r, and returns what
// bad makes of an error reading it.
func eachEntry(r io.Reader, f func(name string, body []byte), bad func(error) error) error {
	tr := tar.NewReader(r)
	for h, err := tr.Next(); err != io.EOF; h, err = tr.Next() {
		if err != nil {
			return bad(err)
		}
		b, _ := io.ReadAll(tr)
		f(h.Name, b)
	}
	return nil
}
