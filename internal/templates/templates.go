package templates

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/dockerfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// importTemplate imports an image from a registry (req.Ref) or an uploaded archive
// as a new version of template req.Name; see recordTemplate.
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
	defer s.beginImport(ctx)()

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
	return s.recordTemplate(ctx, t)
}

// recordTemplate records t as a new version of its name and moves the name
// to it. Sandboxes, snapshots and names holding the version the name left
// keep it; the warm pool drains that version's sandboxes and fills with the
// new one's; the old version goes as soon as nothing holds it.
func (s *Service) recordTemplate(ctx context.Context, t store.Template) (api.Template, error) {
	// In a cluster, the layers are in the object store before any node
	// can see the version.
	pin := newPin()
	defer s.unpin(ctx, pin)
	if err := s.publish(ctx, &t, pin); err != nil {
		return api.Template{}, err
	}
	s.tmplMu.Lock()
	v, prev, err := s.store.PutTemplate(ctx, t)
	s.tmplMu.Unlock()
	if err != nil {
		return api.Template{}, err
	}
	s.noteHeld(v.ID) // made here: this node holds its layers
	if prev != v.ID {
		s.log.Info("template moved to a new version", "template", v.Name, "version", v.ID, "number", v.Number, "previous", prev)
		s.sandboxes.DrainPools(ctx)
		s.Collect(ctx, prev)
	}
	s.sandboxes.WakePools()
	return apiTemplate(t.Name, v, 0), nil
}

// templateUsers counts the sandboxes of each template name, and the
// sandboxes and snapshots of each version, that the tenant of ctx may know
// of: its own, or for admins (who manage templates), all.
func (s *Service) templateUsers(ctx context.Context) (map[string]int, map[string]store.VersionUse, error) {
	t, ok := tenant.FromContext(ctx)
	if !ok || tenant.IsAdmin(t) {
		t = ""
	}
	byName, err := s.store.TemplateUsers(ctx, t)
	if err != nil {
		return nil, nil, err
	}
	byVersion, err := s.store.VersionUsers(ctx, t)
	return byName, byVersion, err
}

// listTemplates returns the built-in template and every name, with its
// current version; names removed while their versions were in use are
// listed, as removed, until the last of those goes.
func (s *Service) listTemplates(ctx context.Context) ([]api.Template, error) {
	users, vusers, err := s.templateUsers(ctx)
	if err != nil {
		return nil, err
	}
	names, err := s.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	all, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Template{s.hostTemplate(users[layers.HostTemplate])}
	owners := layerOwners(all)
	named := map[string]bool{}
	for _, n := range names {
		named[n.Name] = true
		at := apiTemplate(n.Name, n.Current, users[n.Name])
		at.SharedLayers = sharedLayers(n.Current, owners)
		at.OldVersions = len(olderVersions(n.Name, n.Current.ID, s.visibleVersions(ctx, n.Name, n.Current.ID, all, vusers)))
		out = append(out, at)
	}
	if s.seesAllVersions(ctx) {
		for _, v := range all {
			if !named[v.Name] {
				named[v.Name] = true
				out = append(out, api.Template{Name: v.Name, Removed: true, Layers: []string{},
					OldVersions: len(olderVersions(v.Name, "", all)), Sandboxes: users[v.Name]})
			}
		}
		sort.SliceStable(out[1:], func(i, j int) bool { return out[1+i].Name < out[1+j].Name })
	}
	return out, nil
}

// olderVersions are the versions made under name other than current.
func olderVersions(name, current string, all []store.Template) []store.Template {
	var out []store.Template
	for _, v := range all {
		if v.Name == name && v.ID != current {
			out = append(out, v)
		}
	}
	return out
}

// seesAllVersions reports whether ctx may see every version of every
// template and what uses it: admins and the server's own work may. Other
// tenants see a template's current version and those their own sandboxes
// and snapshots hold, and may create only from those: what another
// tenant's sandboxes hold is not theirs to know or to pin.
func (s *Service) seesAllVersions(ctx context.Context) bool {
	t, ok := tenant.FromContext(ctx)
	return !ok || tenant.IsAdmin(t)
}

// getTemplate returns one template with its versions and what uses each.
func (s *Service) getTemplate(ctx context.Context, name string) (api.Template, error) {
	users, vusers, err := s.templateUsers(ctx)
	if err != nil {
		return api.Template{}, err
	}
	if name == layers.HostTemplate {
		return s.hostTemplate(users[name]), nil
	}
	all, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return api.Template{}, err
	}
	at := api.Template{Name: name, Removed: true, Layers: []string{}, Sandboxes: users[name]}
	cur, err := s.store.GetTemplate(ctx, name)
	switch {
	case err == nil:
		at = apiTemplate(name, cur, users[name])
		at.SharedLayers = sharedLayers(cur, layerOwners(all))
	case !errors.Is(err, errdefs.ErrNotFound):
		return api.Template{}, err
	}
	shown := s.visibleVersions(ctx, name, cur.ID, all, vusers)
	if at.Removed && len(shown) == 0 {
		return api.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	at.OldVersions = len(olderVersions(name, cur.ID, shown))
	at.Versions = []api.TemplateVersion{}
	for _, v := range shown {
		at.Versions = append(at.Versions, apiVersion(v, v.ID == cur.ID, vusers[v.ID]))
	}
	return at, nil
}

// visibleVersions are the versions of name (made under it, or current
// for it) that ctx may see (seesAllVersions), newest first.
func (s *Service) visibleVersions(ctx context.Context, name, current string, all []store.Template, users map[string]store.VersionUse) []store.Template {
	seesAll := s.seesAllVersions(ctx)
	var out []store.Template
	for _, v := range all {
		if (v.Name == name || v.ID == current) && (seesAll || v.ID == current || users[v.ID] != (store.VersionUse{})) {
			out = append(out, v)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out
}

// deleteTemplate removes the name name. Its versions stay while sandboxes,
// snapshots or other names hold them, and go with the last; the answer lists
// those still held.
func (s *Service) deleteTemplate(ctx context.Context, name string) (api.TemplateRemoved, error) {
	if name == layers.HostTemplate {
		return api.TemplateRemoved{}, fmt.Errorf("%w: the built-in template cannot be deleted", errdefs.ErrConflict)
	}
	s.tmplMu.Lock()
	cur, err := s.store.GetTemplate(ctx, name)
	if err == nil {
		err = s.store.DeleteTemplate(ctx, name)
	}
	s.tmplMu.Unlock()
	if err != nil {
		return api.TemplateRemoved{}, err
	}
	s.sandboxes.DrainPools(ctx)
	s.Collect(ctx, cur.ID)
	all, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return api.TemplateRemoved{}, err
	}
	_, vusers, err := s.templateUsers(ctx)
	if err != nil {
		return api.TemplateRemoved{}, err
	}
	out := api.TemplateRemoved{Name: name, Held: []api.TemplateVersion{}}
	for _, v := range all {
		if v.Name == name || v.ID == cur.ID {
			out.Held = append(out.Held, apiVersion(v, false, vusers[v.ID]))
		}
	}
	return out, nil
}

// Release collects version id if nothing holds it any more: the sandbox or
// snapshot that held it has gone.
func (s *Service) Release(ctx context.Context, id string) {
	if id != "" {
		s.Collect(ctx, id)
	}
}

// Collect deletes the versions (among ids, or all) that nothing
// holds, then the files no version needs.
func (s *Service) Collect(ctx context.Context, ids ...string) {
	if len(ids) == 1 && ids[0] == "" {
		return
	}
	gone, err := s.store.CollectTemplates(ctx, ids...)
	if err != nil {
		s.log.Warn("collecting template versions", "err", err)
		return
	}
	for _, v := range gone {
		s.log.Info("template version collected", "template", v.Name, "version", v.ID, "number", v.Number)
	}
	s.dropObjects(ctx, gone)
	if len(gone) > 0 || len(ids) == 0 {
		s.collectLayers(ctx)
	}
}

// collectLayers deletes the layers, and the top layers of image templates,
// that no version uses. It waits for a moment when no import runs, since an
// import unpacks layers before it records the version that uses them.
func (s *Service) collectLayers(ctx context.Context) {
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	if s.importing > 0 {
		return
	}
	vs, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return
	}
	used, tops := s.pinnedBuildFiles(), map[string]bool{}
	for _, v := range vs {
		for _, l := range v.Layers {
			used[l] = true
		}
		if v.Config.Base != layers.HostTemplate {
			tops[layers.ImageTemplateKey(v.Name, v.Layers)] = true
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
	if err := s.layers.SweepImageTemplates(tops); err != nil {
		s.log.Warn("removing unused template layers", "err", err)
	}
	// What runtimes made of the layers that went (their images).
	for _, rt := range s.runtimes {
		if p, ok := rt.(runtime.LayerPruner); ok {
			p.PruneLayers()
		}
	}
}

// Resolve finds the version a create names: NAME is the current version of
// template NAME, NAME@N its version number N and NAME@ID the version ID.
// The built-in template has no versions (the zero Template).
func (s *Service) Resolve(ctx context.Context, ref string) (name string, v store.Template, err error) {
	name, ver, versioned := strings.Cut(ref, "@")
	if name == layers.HostTemplate {
		if versioned {
			return "", v, fmt.Errorf("%w: the built-in template has no versions", errdefs.ErrInvalid)
		}
		return name, v, nil
	}
	if !templateName.MatchString(name) {
		return "", v, fmt.Errorf("%w: malformed template name; want NAME or NAME@VERSION", errdefs.ErrInvalid)
	}
	if !versioned {
		v, err = s.store.GetTemplate(ctx, name)
		return name, v, err
	}
	if v, err = s.store.GetTemplateVersion(ctx, name, ver); err != nil {
		return "", v, err
	}
	if !s.seesAllVersions(ctx) {
		cur, _ := s.store.GetTemplate(ctx, name)
		_, users, err := s.templateUsers(ctx)
		if err != nil {
			return "", v, err
		}
		if cur.ID != v.ID && users[v.ID] == (store.VersionUse{}) {
			return "", v, fmt.Errorf("template %s@%s: %w", name, truncate(ver, 24), errdefs.ErrNotFound)
		}
	}
	return name, v, nil
}

// Stack is the layer stack and settings of sandboxes of version v. In a
// cluster, it pulls the layers the node lacks first (Pull).
func (s *Service) Stack(ctx context.Context, v store.Template) (layers.Template, error) {
	if v.ID == "" {
		return s.layers.Template(layers.HostTemplate)
	}
	if _, err := s.Pull(ctx, v); err != nil {
		return layers.Template{}, err
	}
	var lt layers.Template
	var err error
	if v.Config.Base == layers.HostTemplate {
		lt, err = s.layers.HostTemplateWith(v.Layers)
	} else {
		lt, err = s.layers.ImageTemplate(v.Name, v.Layers)
	}
	if err != nil {
		return layers.Template{}, err
	}
	lt.Env = map[string]string{}
	for _, kv := range v.Config.Env {
		if k, val, ok := strings.Cut(kv, "="); ok && k != "" {
			lt.Env[k] = val
		}
	}
	lt.User, lt.Workdir = v.Config.User, v.Config.Workdir
	lt.StartCmd, lt.ReadyCmd = v.Config.StartCmd, v.Config.ReadyCmd
	lt.Setuid = v.Config.Setuid
	return lt, nil
}

// SandboxStack is the layer stack of sb: of the version it was made from,
// whatever its template's name points to now.
func (s *Service) SandboxStack(ctx context.Context, sb store.Sandbox) (layers.Template, error) {
	if sb.TemplateVersion == "" {
		return s.layers.Template(layers.HostTemplate)
	}
	v, err := s.store.TemplateVersion(ctx, sb.TemplateVersion)
	if err != nil {
		return layers.Template{}, err
	}
	return s.Stack(ctx, v)
}

func (s *Service) hostTemplate(users int) api.Template {
	return api.Template{Name: layers.HostTemplate, Source: "builtin", Layers: []string{}, Sandboxes: users,
		CreatedAt: s.layers.HostTemplateTime()}
}

// apiTemplate is name, pointing to version v, as the API shows it.
func apiTemplate(name string, v store.Template, users int) api.Template {
	return api.Template{
		Name: name, Version: v.Number, VersionID: v.ID,
		Source: v.Source, Digest: v.Digest, Layers: v.Layers, Size: v.Size,
		Env: v.Config.Env, Workdir: v.Config.Workdir, User: v.Config.User,
		Entrypoint: v.Config.Entrypoint, Cmd: v.Config.Cmd, StartCmd: v.Config.StartCmd, ReadyCmd: v.Config.ReadyCmd,
		PoolSize: v.Config.PoolSize, Setuid: v.Config.Setuid,
		Sandboxes: users, CreatedAt: v.CreatedAt,
	}
}

func apiVersion(v store.Template, current bool, use store.VersionUse) api.TemplateVersion {
	return api.TemplateVersion{ID: v.ID, Number: v.Number, Current: current, Source: v.Source, Digest: v.Digest,
		Layers: v.Layers, Size: v.Size, Sandboxes: use.Sandboxes, Snapshots: use.Snapshots, CreatedAt: v.CreatedAt}
}

// Import imports an image into a template; see importTemplate.
func (s *Service) Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	return s.importTemplate(ctx, req, archive, progress)
}

// List returns every template.
func (s *Service) List(ctx context.Context) ([]api.Template, error) { return s.listTemplates(ctx) }

// Get returns one template.
func (s *Service) Get(ctx context.Context, name string) (api.Template, error) {
	return s.getTemplate(ctx, name)
}

// Build builds a template from a Dockerfile; see buildTemplate.
func (s *Service) Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	return s.buildTemplate(ctx, name, dockerfile, buildArgs, buildContext, events)
}

// BuildSteps builds a template from instructions given as data; see
// buildSteps.
func (s *Service) BuildSteps(ctx context.Context, name string, ins []dockerfile.Instruction, events func(api.BuildEvent)) (api.Template, error) {
	return s.buildSteps(ctx, name, ins, events)
}

// AddBuildFiles stores the files of a COPY step of BuildSteps; see
// addBuildFiles.
func (s *Service) AddBuildFiles(ctx context.Context, hash string, r io.Reader) error {
	return s.addBuildFiles(ctx, hash, r)
}

// HasBuildFiles reports whether the build files hash are stored.
func (s *Service) HasBuildFiles(hash string) bool { return s.hasBuildFiles(hash) }

// Bootstrap makes a base template with debootstrap; see bootstrapTemplate.
func (s *Service) Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	return s.bootstrapTemplate(ctx, req, events)
}

// Tag gives a template a second name.
func (s *Service) Tag(ctx context.Context, name, tag string) (api.Template, error) {
	return s.tagTemplate(ctx, name, tag)
}

// Delete removes a template's name; see deleteTemplate.
func (s *Service) Delete(ctx context.Context, name string) (api.TemplateRemoved, error) {
	return s.deleteTemplate(ctx, name)
}

// tagTemplate points the name tag at the version ref names (NAME or
// NAME@VERSION); the version tag pointed to before stays while in use.
func (s *Service) tagTemplate(ctx context.Context, ref, tag string) (api.Template, error) {
	if tag == layers.HostTemplate || !templateName.MatchString(tag) {
		return api.Template{}, fmt.Errorf("%w: bad tag %q", errdefs.ErrInvalid, tag)
	}
	if ref == layers.HostTemplate {
		return api.Template{}, fmt.Errorf("%w: the built-in template cannot be tagged", errdefs.ErrInvalid)
	}
	s.tmplMu.Lock()
	_, v, err := s.Resolve(ctx, ref)
	var prev string
	if err == nil {
		prev, err = s.store.PointTemplate(ctx, tag, v.ID)
	}
	s.tmplMu.Unlock()
	if err != nil {
		return api.Template{}, err
	}
	if prev != v.ID {
		s.sandboxes.DrainPools(ctx)
		s.Collect(ctx, prev)
		s.sandboxes.WakePools()
	}
	return apiTemplate(tag, v, 0), nil
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

// layerOwners counts the versions that use each layer.
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

// sharedLayers counts t's layers that other versions use too.
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
