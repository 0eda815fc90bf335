package control

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// importTemplate imports an image from a registry (req.Ref) or an uploaded archive
// into the template req.Name, replacing a template of that name that no
// sandbox uses.
func (s *Service) importTemplate(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	if !templateName.MatchString(req.Name) {
		return api.Template{}, fmt.Errorf("%w: template names are 1-63 of [a-z0-9._-], starting with a letter or digit", errdefs.ErrInvalid)
	}
	if req.Name == layers.HostTemplate {
		return api.Template{}, fmt.Errorf("%w: %q is the built-in template", errdefs.ErrConflict, req.Name)
	}
	if (req.Ref == "") == (archive == nil) {
		return api.Template{}, fmt.Errorf("%w: give an image reference or an archive", errdefs.ErrInvalid)
	}
	s.tmplMu.Lock()
	s.importing++
	s.tmplMu.Unlock()
	defer func() {
		s.tmplMu.Lock()
		s.importing--
		s.tmplMu.Unlock()
		s.collectLayers(context.WithoutCancel(ctx))
	}()

	src := layers.ImportSource{Ref: req.Ref, Username: req.Username, Password: req.Password, Insecure: req.Insecure}
	source := req.Ref
	if archive != nil {
		f, err := os.CreateTemp(s.layers.Dir(), ".upload-*.tar")
		if err != nil {
			return api.Template{}, err
		}
		defer os.Remove(f.Name())
		_, err = io.Copy(f, archive)
		f.Close()
		if err != nil {
			return api.Template{}, fmt.Errorf("%w: reading the uploaded archive: %v", errdefs.ErrInvalid, err)
		}
		src.Archive, source = f.Name(), "archive"
	}
	img, err := s.layers.Import(ctx, src, func(p layers.Progress) {
		if progress != nil {
			progress(api.ImportEvent{Type: "progress", Layer: p.Layer, Bytes: p.Bytes, Total: p.Total, LayersDone: p.LayersDone, Layers: p.Layers})
		}
	})
	if err != nil {
		return api.Template{}, err
	}
	lt, err := s.layers.ImageTemplate(req.Name, img.Layers)
	if err != nil {
		return api.Template{}, err
	}
	if err := s.prepareLayers(ctx, lt); err != nil {
		return api.Template{}, err
	}
	t := store.Template{
		Name: req.Name, Source: source, Digest: img.Digest, Layers: img.Layers, Size: img.Size,
		Config: store.TemplateConfig{
			Env: img.Config.Env, Workdir: img.Config.WorkingDir, User: img.Config.User,
			Entrypoint: img.Config.Entrypoint, Cmd: img.Config.Cmd,
		},
		CreatedAt: time.Now().UTC(),
	}
	if err := s.replaceTemplate(ctx, t); err != nil {
		return api.Template{}, err
	}
	return apiTemplate(t, 0), nil
}

// templateUsers counts the sandboxes of each template that the tenant of
// ctx may know of: its own, or for admins (who delete templates), all.
func (s *Service) templateUsers(ctx context.Context) (map[string]int, error) {
	t, ok := tenant.FromContext(ctx)
	if !ok || tenant.IsAdmin(t) {
		t = ""
	}
	return s.store.TemplateUsers(ctx, t)
}

// listTemplates returns the built-in template and every imported one.
func (s *Service) listTemplates(ctx context.Context) ([]api.Template, error) {
	users, err := s.templateUsers(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := s.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Template{s.hostTemplate(users[layers.HostTemplate])}
	owners := layerOwners(ts)
	for _, t := range ts {
		at := apiTemplate(t, users[t.Name])
		at.SharedLayers = sharedLayers(t, owners)
		out = append(out, at)
	}
	return out, nil
}

// getTemplate returns one template.
func (s *Service) getTemplate(ctx context.Context, name string) (api.Template, error) {
	users, err := s.templateUsers(ctx)
	if err != nil {
		return api.Template{}, err
	}
	if name == layers.HostTemplate {
		return s.hostTemplate(users[name]), nil
	}
	t, err := s.store.GetTemplate(ctx, name)
	if err != nil {
		return api.Template{}, err
	}
	ts, err := s.store.ListTemplates(ctx)
	if err != nil {
		return api.Template{}, err
	}
	at := apiTemplate(t, users[name])
	at.SharedLayers = sharedLayers(t, layerOwners(ts))
	return at, nil
}

// deleteTemplate removes an imported template that no sandbox uses, and the
// layers no other template shares.
func (s *Service) deleteTemplate(ctx context.Context, name string) error {
	if name == layers.HostTemplate {
		return fmt.Errorf("%w: the built-in template cannot be deleted", errdefs.ErrConflict)
	}
	s.drainPool(ctx, name)
	s.tmplMu.Lock()
	t, err := s.store.GetTemplate(ctx, name)
	if err == nil {
		err = s.store.DeleteTemplate(ctx, name)
	}
	s.tmplMu.Unlock()
	if err != nil {
		return err
	}
	// A pooled sandbox may have been finishing while the template went.
	s.drainPool(ctx, name)
	if err := s.layers.RemoveImageTemplate(t.Name, t.Layers); err != nil {
		s.log.Warn("removing template layer", "template", name, "err", err)
	}
	s.collectLayers(ctx)
	return nil
}

// collectLayers deletes layers that no template refers to. It waits for a
// moment when no import runs, since an import unpacks layers before it
// records the template that refers to them.
func (s *Service) collectLayers(ctx context.Context) {
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	if s.importing > 0 {
		return
	}
	ts, err := s.store.ListTemplates(ctx)
	if err != nil {
		return
	}
	used := map[string]bool{}
	for _, t := range ts {
		for _, l := range t.Layers {
			used[l] = true
		}
	}
	ids, err := s.layers.LayerIDs()
	if err != nil {
		return
	}
	for _, id := range ids {
		if !used[id] {
			if err := s.layers.RemoveLayer(id); err != nil {
				s.log.Warn("removing unused layer", "layer", id, "err", err)
			}
		}
	}
}

// template resolves a template name for a new sandbox.
func (s *Service) template(ctx context.Context, name string) (layers.Template, error) {
	if name == layers.HostTemplate {
		return s.layers.Template(name)
	}
	if !templateName.MatchString(name) {
		return layers.Template{}, fmt.Errorf("%w: malformed template name", errdefs.ErrInvalid)
	}
	t, err := s.store.GetTemplate(ctx, name)
	if err != nil {
		return layers.Template{}, err
	}
	var lt layers.Template
	if t.Config.Base == layers.HostTemplate {
		lt, err = s.layers.HostTemplateWith(t.Layers)
	} else {
		lt, err = s.layers.ImageTemplate(name, t.Layers)
	}
	if err != nil {
		return layers.Template{}, err
	}
	lt.Env = map[string]string{}
	for _, kv := range t.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			lt.Env[k] = v
		}
	}
	lt.User, lt.Workdir = t.Config.User, t.Config.Workdir
	lt.StartCmd, lt.ReadyCmd = t.Config.StartCmd, t.Config.ReadyCmd
	return lt, nil
}

func (s *Service) hostTemplate(users int) api.Template {
	return api.Template{Name: layers.HostTemplate, Source: "builtin", Layers: []string{}, Sandboxes: users,
		CreatedAt: s.layers.HostTemplateTime()}
}

func apiTemplate(t store.Template, users int) api.Template {
	return api.Template{
		Name: t.Name, Source: t.Source, Digest: t.Digest, Layers: t.Layers, Size: t.Size,
		Env: t.Config.Env, Workdir: t.Config.Workdir, User: t.Config.User,
		Entrypoint: t.Config.Entrypoint, Cmd: t.Config.Cmd, StartCmd: t.Config.StartCmd, ReadyCmd: t.Config.ReadyCmd,
		PoolSize:  t.Config.PoolSize,
		Sandboxes: users, CreatedAt: t.CreatedAt,
	}
}

// Templates is the template side of a Service, for the API.
type Templates struct{ s *Service }

// Templates returns the Service's template operations.
func (s *Service) Templates() Templates { return Templates{s} }

// Import imports an image into a template; see importTemplate.
func (t Templates) Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	return t.s.importTemplate(ctx, req, archive, progress)
}

// List returns every template.
func (t Templates) List(ctx context.Context) ([]api.Template, error) { return t.s.listTemplates(ctx) }

// Get returns one template.
func (t Templates) Get(ctx context.Context, name string) (api.Template, error) {
	return t.s.getTemplate(ctx, name)
}

// Build builds a template from a Dockerfile; see buildTemplate.
func (t Templates) Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	return t.s.buildTemplate(ctx, name, dockerfile, buildArgs, buildContext, events)
}

// Bootstrap makes a base template with debootstrap; see bootstrapTemplate.
func (t Templates) Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	return t.s.bootstrapTemplate(ctx, req, events)
}

// Tag gives a template a second name.
func (t Templates) Tag(ctx context.Context, name, tag string) (api.Template, error) {
	return t.s.tagTemplate(ctx, name, tag)
}

// Delete removes a template no sandbox uses.
func (t Templates) Delete(ctx context.Context, name string) error {
	return t.s.deleteTemplate(ctx, name)
}

// tagTemplate records template name again under tag, sharing its layers;
// a template called tag that no sandbox uses is replaced.
func (s *Service) tagTemplate(ctx context.Context, name, tag string) (api.Template, error) {
	if tag == layers.HostTemplate || !templateName.MatchString(tag) {
		return api.Template{}, fmt.Errorf("%w: bad tag %q", errdefs.ErrInvalid, tag)
	}
	if name == layers.HostTemplate {
		return api.Template{}, fmt.Errorf("%w: the built-in template cannot be tagged", errdefs.ErrInvalid)
	}
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	t, err := s.store.GetTemplate(ctx, name)
	if err != nil {
		return api.Template{}, err
	}
	if tag == name {
		return apiTemplate(t, 0), nil
	}
	s.tmplMu.Unlock()
	t.Name, t.CreatedAt = tag, time.Now().UTC()
	err = s.replaceTemplate(ctx, t)
	s.tmplMu.Lock() // for the deferred unlock
	if err != nil {
		return api.Template{}, err
	}
	return apiTemplate(t, 0), nil
}

// prepareLayers has the node's default runtime make what its sandboxes over
// lt's layers share (runtime.LayerPreparer: images of the layers), before
// the template is recorded, so that its first sandbox starts as quickly as
// the rest. It refuses a stack of more layers than an overlay takes.
func (s *Service) prepareLayers(ctx context.Context, lt layers.Template) error {
	if len(lt.Layers) > overlay.MaxLayers {
		return fmt.Errorf("%w: a sandbox of the template would stack %d read-only layers (the image's and atoll's top one); an overlay stacks at most %d", errdefs.ErrInvalid, len(lt.Layers), overlay.MaxLayers)
	}
	p, ok := s.runtimes[s.defaults.Runtime].(runtime.LayerPreparer)
	if !ok {
		return nil
	}
	t0 := time.Now()
	if err := p.PrepareLayers(ctx, lt.Layers); err != nil {
		return fmt.Errorf("preparing the template's layers: %w", err)
	}
	s.log.Debug("template layers prepared", "runtime", s.defaults.Runtime, "layers", len(lt.Layers), "ms", time.Since(t0).Milliseconds())
	return nil
}

// replaceTemplate records t, replacing a template of its name that no sandbox
// uses: that one's pooled sandboxes and top layer go. The pool then fills
// for t if t asks for one.
func (s *Service) replaceTemplate(ctx context.Context, t store.Template) error {
	s.drainPool(ctx, t.Name)
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	if old, err := s.store.GetTemplate(ctx, t.Name); err == nil {
		if err := s.store.DeleteTemplate(ctx, t.Name); err != nil {
			return err
		}
		if strings.Join(old.Layers, ",") != strings.Join(t.Layers, ",") {
			_ = s.layers.RemoveImageTemplate(old.Name, old.Layers)
		}
	}
	if err := s.store.PutTemplate(ctx, t); err != nil {
		return err
	}
	if t.Config.PoolSize > 0 {
		s.wakePool()
	}
	return nil
}

// layerOwners counts the templates that use each layer.
func layerOwners(ts []store.Template) map[string]int {
	owners := map[string]int{}
	for _, t := range ts {
		seen := map[string]bool{}
		for _, l := range t.Layers {
			if !seen[l] {
				seen[l] = true
				owners[l]++
			}
		}
	}
	return owners
}

// sharedLayers counts t's layers that other templates use too.
func sharedLayers(t store.Template, owners map[string]int) int {
	n := 0
	seen := map[string]bool{}
	for _, l := range t.Layers {
		if !seen[l] && owners[l] > 1 {
			n++
		}
		seen[l] = true
	}
	return n
}
