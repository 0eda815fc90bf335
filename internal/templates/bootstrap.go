package templates

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/templates"
)

var suiteName = regexp.MustCompile(`^[a-z][a-z0-9-]{1,31}$`)

// bootstrapTemplate makes a base template with debootstrap from a Debian
// mirror: a real Debian with apt, on hosts that cannot reach an image
// registry. The root debootstrap writes becomes the template's one layer,
// or, with req.Build, the layer that one of atoll's own Dockerfiles
// (package templates) builds over as FROM debian: the bootstrapped system
// is never a template of its own then, so a rebuild moves the name from one
// finished template to the next.
func (s *Service) bootstrapTemplate(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	buildCtx, err := checkBootstrap(&req)
	if err != nil {
		return api.Template{}, err
	}
	if events == nil {
		events = func(api.BuildEvent) {}
	}
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		return api.Template{}, fmt.Errorf("%w: debootstrap is not installed on the server (apt-get install debootstrap)", errdefs.ErrUnavailable)
	}
	defer s.beginImport(ctx)()

	dir, err := s.layers.NewLayerDir()
	if err != nil {
		return api.Template{}, err
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(dir)
		}
	}()
	root := filepath.Join(dir, "root")
	if err := debootstrap(ctx, bin, req, root, events); err != nil {
		return api.Template{}, err
	}
	pruneBootstrap(root)
	h := sha256.Sum256([]byte(fmt.Sprintf("debootstrap\x00%s\x00%s\x00%s\x00%d", req.Suite, req.Mirror, req.Variant, time.Now().UnixNano())))
	id := hex.EncodeToString(h[:])
	if err := s.layers.CommitLayer(id, root); err != nil {
		return api.Template{}, err
	}
	committed = true
	os.RemoveAll(dir)
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	source := "debootstrap " + req.Suite + " " + req.Mirror
	if buildCtx != nil {
		// The build holds the layer: collections wait for the import count
		// this bootstrap raised.
		system := store.Template{Layers: []string{id}, Config: store.TemplateConfig{Env: env}}
		return s.buildOver(ctx, req.Name, "Dockerfile", req.BuildArgs, bytes.NewReader(buildCtx),
			map[string]store.Template{"debian": system}, source+" + templates/"+req.Build, events)
	}
	lt, err := s.layers.ImageTemplate(req.Name, []string{id})
	if err != nil {
		return api.Template{}, err
	}
	if err := s.prepareLayers(ctx, lt); err != nil {
		return api.Template{}, err
	}
	t := store.Template{
		Name: req.Name, Source: source, Layers: []string{id},
		Config:    store.TemplateConfig{Env: env},
		CreatedAt: time.Now().UTC(),
	}
	return s.recordTemplate(ctx, t)
}

// checkBootstrap fills in req's defaults and checks it, and returns the
// build context of req.Build, if any.
func checkBootstrap(req *api.BootstrapTemplateRequest) ([]byte, error) {
	if !templateName.MatchString(req.Name) || req.Name == layers.HostTemplate {
		return nil, fmt.Errorf("%w: bad template name", errdefs.ErrInvalid)
	}
	if req.Distro != "debian" {
		return nil, fmt.Errorf("%w: distro must be \"debian\"", errdefs.ErrInvalid)
	}
	if req.Suite == "" {
		req.Suite = "bookworm"
	}
	if req.Mirror == "" {
		req.Mirror = "http://deb.debian.org/debian"
	}
	if req.Variant == "" {
		req.Variant = "minbase"
	}
	if !suiteName.MatchString(req.Suite) {
		return nil, fmt.Errorf("%w: bad suite %q", errdefs.ErrInvalid, truncate(req.Suite, 32))
	}
	if u, err := url.Parse(req.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: the mirror must be an http(s) URL", errdefs.ErrInvalid)
	}
	if req.Variant != "minbase" && req.Variant != "buildd" {
		return nil, fmt.Errorf("%w: variant must be minbase or buildd", errdefs.ErrInvalid)
	}
	if len(req.BuildArgs) > 0 && req.Build == "" {
		return nil, fmt.Errorf("%w: build args need a build", errdefs.ErrInvalid)
	}
	if req.Build != "" {
		buildCtx, ok := templates.Context(req.Build)
		if !ok {
			return nil, fmt.Errorf("%w: build must be one of %s", errdefs.ErrInvalid, strings.Join(templates.Names(), ", "))
		}
		return buildCtx, nil
	}
	return nil, nil
}

// debootstrap runs debootstrap into root, each line of its output an event.
func debootstrap(ctx context.Context, bin string, req api.BootstrapTemplateRequest, root string, events func(api.BuildEvent)) error {
	cmd := exec.CommandContext(ctx, bin, "--variant="+req.Variant, req.Suite, root, req.Mirror)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	var last string
	for sc.Scan() {
		last = sc.Text()
		events(api.BuildEvent{Type: "log", Data: append([]byte(last), '\n')})
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%w: debootstrap failed: %s", errdefs.ErrUnavailable, truncate(last, 200))
	}
	return nil
}

// pruneBootstrap removes what stays out of the layer: device nodes
// (sandboxes get their own /dev) and the downloaded packages.
func pruneBootstrap(root string) {
	filepath.WalkDir(filepath.Join(root, "dev"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&(fs.ModeDevice|fs.ModeCharDevice) != 0 {
			os.Remove(p)
		}
		return nil
	})
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		os.Remove(d)
	}
}

// truncate cuts s to n bytes, for an error message.
func truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
