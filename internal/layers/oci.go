package layers

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	goruntime "runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// ImageConfig is what atoll keeps of an OCI image config.
type ImageConfig struct {
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Image is an imported image.
type Image struct {
	Digest string   // of the image manifest, "sha256:..."
	Layers []string // layer ids (hex diffIDs), bottom first
	Config ImageConfig
	Size   int64 // unpacked bytes of all layers
}

// ImportSource says where an image comes from: exactly one of Ref, Archive and
// Layout.
type ImportSource struct {
	Ref      string // registry reference, e.g. docker.io/library/alpine:3
	Archive  string // a `docker save` tarball, or a tar of an OCI layout
	Layout   string // an OCI layout directory
	Username string
	Password string
	Insecure bool   // the registry speaks plain HTTP
	Platform string // picked from an index; default linux/<GOARCH>
}

// Progress reports an import. Bytes counts the uncompressed bytes of Layer read
// so far; Total is 0 until the layer is done, when it is the layer's size
// (registries tell compressed sizes only).
type Progress struct {
	Layer              string
	Bytes, Total       int64
	LayersDone, Layers int
}

// progressEvery is how many bytes pass between progress calls.
const progressEvery = 1 << 20

// Import fetches an image, unpacks the layers the store lacks and returns the
// image. progress, if not nil, is called from Import's goroutine as layers are
// read.
func (s *Store) Import(ctx context.Context, src ImportSource, progress func(Progress)) (Image, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	plat := v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	if src.Platform != "" {
		p, err := v1.ParsePlatform(src.Platform)
		if err != nil {
			return Image{}, fmt.Errorf("%w: platform %q: %v", errdefs.ErrInvalid, src.Platform, err)
		}
		plat = *p
	}
	n := 0
	for _, set := range []string{src.Ref, src.Archive, src.Layout} {
		if set != "" {
			n++
		}
	}
	if n != 1 {
		return Image{}, fmt.Errorf("%w: an import needs exactly one of a reference, an archive and a layout", errdefs.ErrInvalid)
	}
	var img v1.Image
	var err error
	switch {
	case src.Ref != "":
		img, err = remoteImage(ctx, src, plat)
	case src.Layout != "":
		img, err = layoutImage(src.Layout, plat)
	default:
		var cleanup func()
		img, cleanup, err = s.archiveImage(src.Archive, plat)
		if cleanup != nil {
			defer cleanup()
		}
	}
	if err != nil {
		return Image{}, err
	}
	return s.importImage(ctx, img, progress)
}

func remoteImage(ctx context.Context, src ImportSource, plat v1.Platform) (v1.Image, error) {
	var nopts []name.Option
	if src.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.ParseReference(src.Ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: image reference %q: %v", errdefs.ErrInvalid, src.Ref, err)
	}
	var auth authn.Authenticator = authn.Anonymous
	if src.Username != "" || src.Password != "" {
		auth = &authn.Basic{Username: src.Username, Password: src.Password}
	}
	// remote.Image resolves an index to the platform's image.
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuth(auth), remote.WithPlatform(plat))
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", ref, registryErr(err))
	}
	return img, nil
}

// registryErr gives a registry's answer an errdefs kind.
func registryErr(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case 401, 403:
			return fmt.Errorf("%w: %v", errdefs.ErrUnauthorized, err)
		case 404:
			return fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
		}
	}
	return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
}

func layoutImage(dir string, plat v1.Platform) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: reading OCI layout: %v", errdefs.ErrInvalid, err)
	}
	return pickImage(idx, plat, 0)
}

// pickImage finds the image for plat in idx, following nested indexes (docker
// save writes an index.json that points at the image's index). An image with
// no platform is taken when it is the only one.
func pickImage(idx v1.ImageIndex, plat v1.Platform, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%w: image indexes nested too deep", errdefs.ErrInvalid)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: reading image index: %v", errdefs.ErrInvalid, err)
	}
	var unplatformed []v1.Descriptor
	for _, d := range im.Manifests {
		switch {
		case d.Platform != nil && !d.Platform.Satisfies(plat):
			continue
		case d.MediaType.IsIndex():
			if img, err := idx.ImageIndex(d.Digest); err == nil {
				if img, err := pickImage(img, plat, depth+1); err == nil {
					return img, nil
				}
			}
		case d.MediaType.IsImage():
			if d.Platform != nil {
				return idx.Image(d.Digest)
			}
			unplatformed = append(unplatformed, d)
		}
	}
	switch len(unplatformed) {
	case 0:
		return nil, fmt.Errorf("%w: no image for %s", errdefs.ErrNotFound, plat)
	case 1:
		return idx.Image(unplatformed[0].Digest)
	}
	return nil, fmt.Errorf("%w: %d images and none says its platform", errdefs.ErrInvalid, len(unplatformed))
}

// archiveImage opens a `docker save` tarball (it has manifest.json) in place, or
// extracts an OCI layout archive to a temporary directory that cleanup removes.
func (s *Store) archiveImage(file string, plat v1.Platform) (img v1.Image, cleanup func(), err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("opening image archive: %w", err)
	}
	defer f.Close()
	docker, oci := false, false
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: reading image archive: %v", errdefs.ErrInvalid, err)
		}
		switch path.Clean(hdr.Name) {
		case "manifest.json":
			docker = true
		case "index.json":
			oci = true
		}
	}
	switch {
	case docker:
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: reading docker archive: %v", errdefs.ErrInvalid, err)
		}
		return img, nil, nil
	case !oci:
		return nil, nil, fmt.Errorf("%w: image archive has neither manifest.json nor index.json", errdefs.ErrInvalid)
	}
	tmp, err := os.MkdirTemp(s.layersDir(), tmpPrefix+"archive-")
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	if err := s.extractArchive(f, tmp); err != nil {
		cleanup()
		return nil, nil, err
	}
	img, err = layoutImage(tmp, plat)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return img, cleanup, nil
}

// extractArchive extracts the directories and regular files of the tar f (from
// its start) under dir; an OCI layout has nothing else.
func (s *Store) extractArchive(f *os.File, dir string) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	maxBytes, _ := s.limits()
	var total int64
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: reading image archive: %v", errdefs.ErrInvalid, err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += hdr.Size; hdr.Size < 0 || total > maxBytes {
				return fmt.Errorf("%w: image archive", errdefs.ErrTooLarge)
			}
			if d := path.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o700); err != nil {
					return err
				}
			}
			out, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("%w: image archive entry %q: %v", errdefs.ErrInvalid, hdr.Name, err)
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%w: reading image archive: %v", errdefs.ErrInvalid, err)
			}
		default:
			return fmt.Errorf("%w: image archive entry %q is not a file or directory", errdefs.ErrInvalid, hdr.Name)
		}
	}
}

func (s *Store) importImage(ctx context.Context, img v1.Image, progress func(Progress)) (Image, error) {
	digest, err := img.Digest()
	if err != nil {
		return Image{}, imageErr("reading manifest", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, imageErr("reading image config", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return Image{}, fmt.Errorf("%w: image is for %s", errdefs.ErrInvalid, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, imageErr("reading layers", err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return Image{}, fmt.Errorf("%w: image has %d layers and %d diffIDs", errdefs.ErrInvalid, len(layers), len(cf.RootFS.DiffIDs))
	}
	maxBytes, maxEntries := s.limits()
	out := Image{Digest: digest.String()}
	for i, l := range layers {
		diffID := cf.RootFS.DiffIDs[i]
		if diffID.Algorithm != "sha256" || !validLayerID(diffID.Hex) {
			return Image{}, fmt.Errorf("%w: layer diffID %q", errdefs.ErrInvalid, diffID)
		}
		id := diffID.Hex
		p := Progress{Layer: id, LayersDone: i, Layers: len(layers)}
		var size int64
		if s.HasLayer(id) {
			if size, err = treeSize(s.LayerDir(id)); err != nil {
				return Image{}, err
			}
		} else {
			rc, err := l.Uncompressed()
			if err != nil {
				return Image{}, imageErr("reading layer "+shortID(id), err)
			}
			pr := &progressReader{r: rc, p: p, fn: progress}
			_, size, err = s.addLayer(ctx, id, pr, maxBytes-out.Size, maxEntries)
			if cerr := rc.Close(); err == nil && cerr != nil {
				err = imageErr("reading layer "+shortID(id), cerr)
			}
			if err != nil && pr.err != nil {
				if rerr := imageErr("reading layer "+shortID(id), pr.err); !errors.Is(rerr, errdefs.ErrInvalid) {
					err = rerr
				}
			}
			if err != nil {
				return Image{}, err
			}
		}
		out.Size += size
		if out.Size > maxBytes {
			return Image{}, fmt.Errorf("%w: image unpacks to more than %d bytes", errdefs.ErrTooLarge, maxBytes)
		}
		out.Layers = append(out.Layers, id)
		p.Bytes, p.Total, p.LayersDone = size, size, i+1
		progress(p)
	}
	c := cf.Config
	out.Config = ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	return out, nil
}

// imageErr wraps an error of reading an image, which is the image's fault
// unless the registry was unreachable or refused.
func imageErr(what string, err error) error {
	var terr *transport.Error
	var nerr net.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	case errors.As(err, &terr), errors.As(err, &nerr):
		return fmt.Errorf("%s: %w", what, registryErr(err))
	}
	return fmt.Errorf("%s: %w: %v", what, errdefs.ErrInvalid, err)
}

// progressReader reports the bytes read through it, every progressEvery.
type progressReader struct {
	r    io.Reader
	p    Progress
	fn   func(Progress)
	last int64
	err  error // the first error but EOF, to tell a broken download from a bad layer
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	r.p.Bytes += int64(n)
	if r.p.Bytes-r.last >= progressEvery {
		r.last = r.p.Bytes
		r.fn(r.p)
	}
	return n, err
}
