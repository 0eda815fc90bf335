package main

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/atoll-dev/atoll/api"
)

// templates measures importing a ~100 MB image from a registry (served here
// over the registry protocol), importing it again under another name, the
// disk it takes, and create → ready from it (its first sandbox, then more)
// beside the host template.
func templates(r *report, srv *server, n int) {
	ctx := context.Background()
	c := srv.client()
	img, size, cleanup := benchImage()
	defer cleanup()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://")+"/bench/py:1", name.Insecure)
	check(err)
	check(remote.Write(ref, img))

	t0 := time.Now()
	_, err = c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "bench", Ref: ref.String(), Insecure: true}, nil)
	check(err)
	first := time.Since(t0)
	t0 = time.Now()
	_, err = c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "bench2", Ref: ref.String(), Insecure: true}, nil)
	check(err)
	second := time.Since(t0)
	disk := dirBytes(filepath.Join(srv.data, "layers", "layers"))
	r.add(fmt.Sprintf("template import of a %d MB image (registry, first)", size>>20), "once", []time.Duration{first})
	r.add("template import of the same image under a new name (layers shared)", "once", []time.Duration{second})
	r.notes = append(r.notes, fmt.Sprintf("Imported image: %.1f MB of files in %d layers; unpacked layers on disk after both imports: %.1f MB (shared, unpacked once).",
		float64(size)/(1<<20), len(mustLayers(img)), float64(disk)/(1<<20)))

	// The first sandbox of a template new to the node: the images of its
	// layers are made by the import (runtime.LayerPreparer), or else here.
	t0 = time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "bench"})
	check(err)
	r.add("atoll create → ready (API), the imported template's first sandbox", "once", []time.Duration{time.Since(t0)})
	check(c.DeleteSandbox(ctx, sb.ID))

	for _, tmpl := range []string{"bench", "host"} {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: tmpl})
			check(err)
			ds = append(ds, time.Since(t0))
			check(c.DeleteSandbox(ctx, sb.ID))
		}
		r.add(fmt.Sprintf("atoll create → ready (API), cold, template %s", tmpl), "sequential", ds)
	}
	for _, name := range []string{"bench", "bench2"} {
		_, err := c.DeleteTemplate(ctx, name)
		check(err)
	}
}

// benchImage makes an image of three layers from the host's Python and Perl
// libraries, about 100 MB, and returns it with its file bytes and a function
// that removes its files.
func benchImage() (v1.Image, int64, func()) {
	var layers []v1.Layer
	var total int64
	var files []string
	for _, dir := range []string{"/usr/lib/python3.11", "/usr/share/perl", "/usr/lib/x86_64-linux-gnu/perl"} {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		tmp, err := os.CreateTemp("", "bench-layer-*.tar")
		check(err)
		files = append(files, tmp.Name())
		tw := tar.NewWriter(tmp)
		check(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			link := ""
			if fi.Mode()&os.ModeSymlink != 0 {
				link, _ = os.Readlink(p)
			} else if !fi.Mode().IsRegular() && !fi.IsDir() {
				return nil
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return nil
			}
			h.Name = strings.TrimPrefix(p, "/")
			if fi.IsDir() {
				h.Name += "/"
			}
			check(tw.WriteHeader(h))
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				check(err)
				k, err := io.Copy(tw, f)
				f.Close()
				check(err)
				total += k
			}
			return nil
		}))
		check(tw.Close())
		check(tmp.Close())
		l, err := tarball.LayerFromFile(tmp.Name())
		check(err)
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	check(err)
	return img, total, func() {
		for _, f := range files {
			os.Remove(f)
		}
	}
}

func mustLayers(img v1.Image) []v1.Layer {
	ls, err := img.Layers()
	check(err)
	return ls
}

func dirBytes(dir string) int64 {
	out, err := exec.Command("du", "-sb", dir).Output()
	if err != nil {
		return 0
	}
	var n int64
	fmt.Sscan(string(out), &n)
	return n
}
