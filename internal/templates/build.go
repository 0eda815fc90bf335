package templates

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/dockerfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/store"
)

// Builds run each RUN step in a sandbox of their own, a hidden one (state
// building) so that it gets a uid range and a crash cleans it up, and turn its
// writable layer into a layer. Every step that makes a layer is cached under a
// key of everything it depends on (the base layers, the instructions before it
// and the files it copies), and the key is the layer's ID: an unchanged
// rebuild only finds layers.

// buildState is the image being built, instruction by instruction.
type buildState struct {
	base    string   // "host" or "" (an image)
	layers  []string // bottom first
	key     string   // cache key of everything so far
	vars    map[string]string
	env     []string // K=V, in order
	workdir string
	user    string
	cmd     []string
	entry   []string
	start   string // LABEL atoll.start
	ready   string // LABEL atoll.ready
	pool    int    // LABEL atoll.pool
	setuid  bool   // LABEL atoll.setuid
	// from names versions FROM takes before atoll's templates: the
	// system a bootstrap made, for the Dockerfile it builds over it.
	from map[string]store.Template
}

// argEnv is the environment a RUN step gets from the ARGs in scope, as
// docker build gives it: each ARG whose name no ENV has set (ENV wins),
// for the step only, never written into the image's Env. An ARG's value
// is in the chain key from its ARG on, so a change rebuilds the steps
// after it.
func (b *buildState) argEnv() map[string]string {
	env := b.envMap()
	out := map[string]string{}
	for k, v := range b.vars {
		if _, ok := env[k]; !ok {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (b *buildState) envMap() map[string]string {
	m := map[string]string{}
	for _, kv := range b.env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func (b *buildState) setEnv(k, v string) {
	for i, kv := range b.env {
		if strings.HasPrefix(kv, k+"=") {
			b.env[i] = k + "=" + v
			return
		}
	}
	b.env = append(b.env, k+"="+v)
}

// chain extends the cache key with parts.
func (b *buildState) chain(parts ...string) {
	h := sha256.New()
	h.Write([]byte(b.key))
	for _, p := range parts {
		fmt.Fprintf(h, "\x00%d:%s", len(p), p)
	}
	b.key = hex.EncodeToString(h.Sum(nil))
}

// expandVars are what ${...} sees: build args overridden by ENV.
func (b *buildState) expandVars() map[string]string {
	m := map[string]string{}
	for k, v := range b.vars {
		m[k] = v
	}
	for k, v := range b.envMap() {
		m[k] = v
	}
	return m
}

func (s *Service) buildTemplate(ctx context.Context, name, dockerfilePath string, args map[string]string, buildCtx io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	return s.buildOver(ctx, name, dockerfilePath, args, buildCtx, nil, "build", events)
}

// buildOver builds as buildTemplate does, with FROM taking the versions in
// from first, and records the template with source.
func (s *Service) buildOver(ctx context.Context, name, dockerfilePath string, args map[string]string, buildCtx io.Reader, from map[string]store.Template, source string, events func(api.BuildEvent)) (api.Template, error) {
	if !templateName.MatchString(name) || name == layers.HostTemplate {
		return api.Template{}, fmt.Errorf("%w: template names are 1-63 of [a-z0-9._-] and not %q", errdefs.ErrInvalid, layers.HostTemplate)
	}
	defer s.beginImport(ctx)()

	// The build context becomes a layer: unpacked safely (no escapes, no
	// devices), read-only, and removed with the next collection.
	ctxID, _, err := s.layers.AddLayerDigest(ctx, buildCtx)
	if err != nil {
		return api.Template{}, fmt.Errorf("reading the build context: %w", err)
	}
	root, err := os.OpenRoot(s.layers.LayerDir(ctxID))
	if err != nil {
		return api.Template{}, err
	}
	defer root.Close()
	if dockerfilePath == "" {
		dockerfilePath = "Dockerfile"
	}
	f, err := root.Open(dockerfilePath)
	if err != nil {
		return api.Template{}, fmt.Errorf("%w: no Dockerfile %q in the build context", errdefs.ErrInvalid, dockerfilePath)
	}
	ins, err := dockerfile.Parse(f)
	f.Close()
	if err != nil {
		return api.Template{}, err
	}
	return s.runBuild(ctx, name, ins, args, root, from, source, events)
}

// buildSteps builds template name from instructions given as data rather
// than Dockerfile text: E2B's template builds, whose steps package e2b
// translates. Beyond what Parse makes, the instructions may carry flags no
// Dockerfile can: "files" on COPY names uploaded build files (see
// addBuildFiles), which are then its build context; "user" on RUN runs that
// step alone as the user, and "cwd" in that directory; "force" rebuilds the step, and so every step after
// it, whatever the cache holds; "image" on FROM imports the reference from a
// registry even if a template has that name.
func (s *Service) buildSteps(ctx context.Context, name string, ins []dockerfile.Instruction, events func(api.BuildEvent)) (api.Template, error) {
	if !templateName.MatchString(name) || name == layers.HostTemplate {
		return api.Template{}, fmt.Errorf("%w: template names are 1-63 of [a-z0-9._-] and not %q", errdefs.ErrInvalid, layers.HostTemplate)
	}
	if len(ins) == 0 || ins[0].Cmd != "FROM" || len(ins[0].Args) != 1 {
		return api.Template{}, fmt.Errorf("%w: a build starts from one template or image", errdefs.ErrInvalid)
	}
	for i, in := range ins[1:] {
		if in.Cmd == "FROM" || !supportedStep[in.Cmd] {
			return api.Template{}, fmt.Errorf("%w: step %d: unsupported instruction %q", errdefs.ErrInvalid, i+2, in.Cmd)
		}
	}
	defer s.beginImport(ctx)()
	return s.runBuild(ctx, name, ins, nil, nil, nil, "build", events)
}

// supportedStep are the instructions buildSteps takes after FROM.
var supportedStep = map[string]bool{"RUN": true, "COPY": true, "ENV": true, "WORKDIR": true, "USER": true, "LABEL": true, "CMD": true, "ENTRYPOINT": true}

// beginImport keeps the layer collector away while a build or upload holds
// layers no version records yet; the function it returns ends that, and
// collects what the build left unused.
func (s *Service) beginImport(ctx context.Context) func() {
	s.tmplMu.Lock()
	s.importing++
	s.tmplMu.Unlock()
	return func() {
		s.tmplMu.Lock()
		s.importing--
		s.tmplMu.Unlock()
		s.collectLayers(context.WithoutCancel(ctx))
	}
}

// runBuild applies ins in order and records the result as a new version of
// name, made by source. ctxRoot is the build context of COPY steps without
// uploaded files; FROM takes the versions in from first.
func (s *Service) runBuild(ctx context.Context, name string, ins []dockerfile.Instruction, args map[string]string, ctxRoot *os.Root, from map[string]store.Template, source string, events func(api.BuildEvent)) (api.Template, error) {
	if events == nil {
		events = func(api.BuildEvent) {}
	}
	st := &buildState{vars: map[string]string{}, from: from}
	declared := map[string]bool{}
	for i, in := range ins {
		announce := func(cached bool) {
			events(api.BuildEvent{Type: "step", Step: i + 1, Steps: len(ins), Instruction: in.Text, Cached: cached})
		}
		if err := s.buildStep(ctx, st, in, args, declared, ctxRoot, announce, events); err != nil {
			return api.Template{}, fmt.Errorf("step %d (%s): %w", i+1, in.Cmd, err)
		}
	}

	// Its size is its layers', counted as an import counts them (the host
	// template's files, under a build FROM host, are not its own).
	size := int64(0)
	for _, id := range st.layers {
		n, err := s.layers.LayerSize(id)
		if err != nil {
			return api.Template{}, err
		}
		size += n
	}
	t := store.Template{
		Name: name, Source: source, Layers: st.layers, Size: size,
		Config: store.TemplateConfig{
			Base: st.base, Env: st.env, Workdir: st.workdir, User: st.user, Entrypoint: st.entry, Cmd: st.cmd,
			StartCmd: st.start, ReadyCmd: st.ready, PoolSize: st.pool, Setuid: st.setuid,
		},
		CreatedAt: time.Now().UTC(),
	}
	lt, err := s.stackOf(st, name)
	if err != nil {
		return api.Template{}, err
	}
	if err := s.prepareLayers(ctx, lt); err != nil {
		return api.Template{}, err
	}
	return s.recordTemplate(ctx, t)
}

// buildStep applies one instruction. It calls announce once, before doing the
// work, saying whether the step's layer comes from the cache.
func (s *Service) buildStep(ctx context.Context, st *buildState, in dockerfile.Instruction, args map[string]string, declared map[string]bool, ctxRoot *os.Root, announce func(cached bool), events func(api.BuildEvent)) error {
	if in.Flags["force"] != "" {
		// A key no earlier build made: this step and every one after it
		// (whose keys chain from it) miss the cache.
		st.chain("FORCE", rand.Text())
	}
	if in.Cmd == "COPY" || in.Cmd == "ADD" {
		if hash := in.Flags["files"]; hash != "" {
			root, err := s.buildFilesRoot(hash)
			if err != nil {
				return err
			}
			defer root.Close()
			ctxRoot = root
		}
		if ctxRoot == nil {
			return fmt.Errorf("%w: %s without build files", errdefs.ErrInvalid, in.Cmd)
		}
		return s.buildCopy(st, in, ctxRoot, announce)
	}
	if in.Cmd == "RUN" {
		user, cwd := st.user, st.workdir
		if u := in.Flags["user"]; u != "" {
			user = u
		}
		if c := in.Flags["cwd"]; c != "" {
			cwd = c
		}
		parts := []string{"RUN", strconv.FormatBool(in.Exec), strings.Join(in.Args, "\x00"), strings.Join(st.env, "\x00"), user, cwd}
		if st.setuid {
			// sudo works in the step's sandbox (appended only when set,
			// so that other builds keep their cache).
			parts = append(parts, "setuid")
		}
		st.chain(parts...)
		cached := s.layers.HasLayer(st.key)
		announce(cached)
		if !cached {
			if err := s.buildRun(ctx, st, user, cwd, in, events); err != nil {
				return err
			}
		}
		st.layers = append(st.layers, st.key)
		return nil
	}
	announce(false)
	_, err := s.buildConfig(ctx, st, in, args, declared)
	return err
}

// buildConfig applies an instruction that changes only the image's settings.
func (s *Service) buildConfig(ctx context.Context, st *buildState, in dockerfile.Instruction, args map[string]string, declared map[string]bool) (bool, error) {
	expand := func(v string) (string, error) { return dockerfile.Expand(v, st.expandVars()) }
	switch in.Cmd {
	case "ARG":
		name := in.Args[0]
		declared[name] = true
		if v, ok := args[name]; ok {
			st.vars[name] = v
		} else if in.Flags["default"] != "" {
			st.vars[name] = in.Args[1]
		}
		st.chain("ARG", name, st.vars[name])
		return false, nil
	case "FROM":
		ref, err := expand(in.Args[0])
		if err != nil {
			return false, err
		}
		return false, s.buildFrom(ctx, st, ref, in.Flags["image"] != "")
	case "ENV":
		for i := 0; i+1 < len(in.Args); i += 2 {
			v, err := expand(in.Args[i+1])
			if err != nil {
				return false, err
			}
			st.setEnv(in.Args[i], v)
		}
		st.chain(append([]string{"ENV"}, st.env...)...)
		return false, nil
	case "LABEL":
		// atoll.start and atoll.ready set the template's start and ready
		// commands; other labels are not kept yet.
		for i := 0; i+1 < len(in.Args); i += 2 {
			v, err := expand(in.Args[i+1])
			if err != nil {
				return false, err
			}
			switch in.Args[i] {
			case "atoll.start":
				st.start = v
			case "atoll.ready":
				st.ready = v
			case "atoll.pool":
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || n > 64 {
					return false, fmt.Errorf("%w: atoll.pool must be a number from 0 to 64", errdefs.ErrInvalid)
				}
				st.pool = n
			case "atoll.setuid":
				b, err := strconv.ParseBool(v)
				if err != nil {
					return false, fmt.Errorf("%w: atoll.setuid must be true or false", errdefs.ErrInvalid)
				}
				st.setuid = b
			}
		}
		return false, nil
	case "WORKDIR":
		dir, err := expand(in.Args[0])
		if err != nil {
			return false, err
		}
		if !path.IsAbs(dir) {
			dir = path.Join(orRoot(st.workdir), dir)
		}
		st.workdir = path.Clean(dir)
		st.chain("WORKDIR", st.workdir)
		return false, nil
	case "USER":
		u, err := expand(in.Args[0])
		if err != nil {
			return false, err
		}
		st.user = u
		st.chain("USER", u)
		return false, nil
	case "CMD", "ENTRYPOINT":
		argv := in.Args
		if !in.Exec {
			argv = []string{"/bin/sh", "-c", in.Args[0]}
		}
		if in.Cmd == "CMD" {
			st.cmd = argv
		} else {
			st.entry = argv
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: unsupported instruction %s", errdefs.ErrInvalid, in.Cmd)
}

func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

// buildFrom starts the build from an atoll template or an image reference.
func (s *Service) buildFrom(ctx context.Context, st *buildState, ref string, image bool) error {
	if ref == layers.HostTemplate && !image {
		st.base = layers.HostTemplate
		st.chain("FROM", ref)
		return nil
	}
	// FROM NAME builds on NAME's current version; FROM NAME@VERSION on
	// that one.
	t, ok := st.from[ref]
	if !ok && !image {
		if _, v, err := s.Resolve(ctx, ref); err == nil && v.ID != "" {
			t, ok = v, true
		}
	}
	if ok {
		// In a cluster the base may have been made on another node.
		if _, err := s.Pull(ctx, t); err != nil {
			return fmt.Errorf("FROM %s: %w", ref, err)
		}
		st.base = t.Config.Base
		st.layers = append([]string(nil), t.Layers...)
		st.env = append([]string(nil), t.Config.Env...)
		st.workdir, st.user, st.cmd, st.entry = t.Config.Workdir, t.Config.User, t.Config.Cmd, t.Config.Entrypoint
		st.start, st.ready, st.pool = t.Config.StartCmd, t.Config.ReadyCmd, t.Config.PoolSize
		st.setuid = t.Config.Setuid
		st.chain(append([]string{"FROM", st.base}, st.layers...)...)
		return nil
	}
	img, err := s.layers.Import(ctx, layers.ImportSource{Ref: ref}, nil)
	if err != nil && image {
		return fmt.Errorf("importing image %s: %w", ref, err)
	}
	if err != nil {
		return fmt.Errorf("FROM %s: not a template, and importing it failed: %w", ref, err)
	}
	st.layers = img.Layers
	st.env = img.Config.Env
	st.workdir, st.user, st.cmd, st.entry = img.Config.WorkingDir, img.Config.User, img.Config.Cmd, img.Config.Entrypoint
	st.chain(append([]string{"FROM"}, st.layers...)...)
	return nil
}

// rootfsOf is the layer stack of the build so far.
func (s *Service) rootfsOf(st *buildState) (layers.Template, error) {
	return s.stackOf(st, "build-"+st.key[:12])
}

// stackOf is the layer stack of st's layers as the template name.
func (s *Service) stackOf(st *buildState, name string) (layers.Template, error) {
	if st.base == layers.HostTemplate {
		return s.layers.HostTemplateWith(st.layers)
	}
	return s.layers.ImageTemplate(name, st.layers)
}

// buildRun runs a RUN step as user in cwd, in a hidden sandbox over the
// build so far, and turns what it wrote into the layer st.key.
func (s *Service) buildRun(ctx context.Context, st *buildState, user, cwd string, in dockerfile.Instruction, events func(api.BuildEvent)) error {
	tmpl, err := s.rootfsOf(st)
	if err != nil {
		return err
	}
	if st.base != layers.HostTemplate {
		defer s.layers.RemoveImageTemplate("build-"+st.key[:12], st.layers)
	}
	bctx := context.WithoutCancel(ctx)
	tmpl.Env = st.envMap()
	tmpl.User, tmpl.Workdir = "", "" // set per exec below
	tmpl.Setuid = st.setuid
	sb, err := s.sandboxes.StartScratch(bctx, tmpl)
	if err != nil {
		return err
	}
	defer sb.Discard(bctx)
	c := sb.Agent()
	if cwd != "" {
		if _, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"mkdir", "-p", cwd}}); err != nil {
			return fmt.Errorf("making WORKDIR: %w", err)
		}
	}
	req := api.ExecRequest{User: user, Cwd: cwd, Env: st.argEnv()}
	if in.Exec {
		req.Cmd = in.Args
	} else {
		req.Shell = in.Args[0]
	}
	stream, err := c.ExecStream(ctx, req)
	if err != nil {
		return err
	}
	code := -1
	for code == -1 {
		ev, err := stream.Next()
		if err != nil {
			stream.Close()
			return fmt.Errorf("reading the step's output: %w", err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			events(api.BuildEvent{Type: "log", Data: ev.Data})
		case api.EventExit:
			code = 128 // killed by a signal
			if ev.ExitCode != nil && *ev.ExitCode >= 0 {
				code = *ev.ExitCode
			}
		case api.EventError:
			stream.Close()
			return fmt.Errorf("%w: %s", errdefs.ErrInvalid, ev.Message)
		}
	}
	stream.Close()
	if code != 0 {
		return fmt.Errorf("%w: the command exited with %d", errdefs.ErrInvalid, code)
	}
	if err := sb.Stop(bctx); err != nil {
		return err
	}
	dir, err := s.layers.NewLayerDir()
	if err != nil {
		return err
	}
	if err := layers.CloneTree(filepath.Join(s.layers.WritableDir(sb.ID()), "upper"), dir); err != nil {
		os.RemoveAll(dir)
		return err
	}
	return s.layers.CommitLayer(st.key, dir)
}

// buildCopy makes the layer of a COPY or ADD from files of the build context.
func (s *Service) buildCopy(st *buildState, in dockerfile.Instruction, ctxRoot *os.Root, announce func(cached bool)) error {
	cached, err := s.copyLayer(st, in, ctxRoot, announce)
	if err == nil && !cached {
		st.layers = append(st.layers, st.key)
	}
	return err
}

func (s *Service) copyLayer(st *buildState, in dockerfile.Instruction, ctxRoot *os.Root, announce func(cached bool)) (bool, error) {
	srcs, dst, uid, gid, err := copyArgs(st, in)
	if err != nil {
		return false, err
	}
	// Hash what is copied, so the cache sees changed files.
	items, sum, err := copySources(ctxRoot, in.Cmd, srcs)
	if err != nil {
		return false, err
	}
	st.chain(in.Cmd, strings.Join(srcs, "\x00"), dst, in.Flags["chown"], in.Flags["chmod"], hex.EncodeToString(sum))
	if s.layers.HasLayer(st.key) {
		announce(true)
		st.layers = append(st.layers, st.key)
		return true, nil
	}
	announce(false)
	lowers, err := s.lowerRoots(st)
	if err != nil {
		return false, err
	}
	defer func() {
		for _, l := range lowers {
			l.Close()
		}
	}()
	dir, err := s.layers.NewLayerDir()
	if err != nil {
		return false, err
	}
	out, err := os.OpenRoot(dir)
	if err != nil {
		return false, err
	}
	defer out.Close()
	t := copyTarget{out: out, dir: dir, dst: dst, toDir: strings.HasSuffix(dst, "/") || len(srcs) > 1,
		uid: uid, gid: gid, lowers: lowers}
	for _, it := range items {
		if err := s.copyItem(ctxRoot, in, it, t); err != nil {
			return false, err
		}
	}
	return false, s.layers.CommitLayer(st.key, dir)
}

// copyArgs expands a COPY or ADD's arguments into its sources and its
// absolute destination, and its --chown into IDs (-1 when not given).
func copyArgs(st *buildState, in dockerfile.Instruction) (srcs []string, dst string, uid, gid int, err error) {
	expand := func(v string) (string, error) { return dockerfile.Expand(v, st.expandVars()) }
	args := make([]string, len(in.Args))
	for i, a := range in.Args {
		v, err := expand(a)
		if err != nil {
			return nil, "", -1, -1, err
		}
		args[i] = v
	}
	srcs, dst = args[:len(args)-1], args[len(args)-1]
	if !path.IsAbs(dst) {
		d := path.Join(orRoot(st.workdir), dst)
		if strings.HasSuffix(dst, "/") {
			d += "/"
		}
		dst = d
	}
	uid, gid = -1, -1
	if own := in.Flags["chown"]; own != "" {
		u, g, _ := strings.Cut(own, ":")
		if uid, err = idOf(u); err != nil {
			return nil, "", -1, -1, err
		}
		gid = uid
		if g != "" {
			if gid, err = idOf(g); err != nil {
				return nil, "", -1, -1, err
			}
		}
	}
	return srcs, dst, uid, gid, nil
}

// copyItem is a file or directory of the build context that a COPY or ADD
// copies: rel, found under src, one of its sources.
type copyItem struct{ src, rel string }

// copySources checks that the sources are in the build context and lists
// what they hold, with a hash of its names, modes, sizes and contents.
func copySources(ctxRoot *os.Root, cmd string, srcs []string) ([]copyItem, []byte, error) {
	var items []copyItem
	h := sha256.New()
	for _, src := range srcs {
		if cmd == "ADD" && (strings.Contains(src, "://") || strings.HasPrefix(src, "git@")) {
			return nil, nil, fmt.Errorf("%w: ADD of URLs is not supported; download in a RUN step", errdefs.ErrInvalid)
		}
		clean := path.Clean("/" + src)[1:]
		if clean == "" {
			clean = "."
		}
		if strings.Contains(src, "..") && path.Clean(src) != clean {
			return nil, nil, fmt.Errorf("%w: %s source %q leaves the build context", errdefs.ErrInvalid, cmd, src)
		}
		if _, err := ctxRoot.Lstat(clean); err != nil {
			return nil, nil, fmt.Errorf("%w: %s source %q: not in the build context", errdefs.ErrInvalid, cmd, src)
		}
		err := fs.WalkDir(ctxRoot.FS(), clean, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00%o\x00%d\x00", p, fi.Mode(), fi.Size())
			if fi.Mode().IsRegular() {
				f, err := ctxRoot.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(h, f)
				f.Close()
				if err != nil {
					return err
				}
			}
			items = append(items, copyItem{src: clean, rel: p})
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	return items, h.Sum(nil), nil
}

// copyTarget is where a COPY or ADD writes: out, the new layer's directory
// dir opened as a root, over lowers; dst is the destination in the image,
// a directory when toDir; uid and gid own what is written unless -1.
type copyTarget struct {
	out      *os.Root
	dir, dst string
	toDir    bool
	uid, gid int
	lowers   []*os.Root
}

// copyItem writes one item into the layer, an archive ADD unpacks
// included.
func (s *Service) copyItem(ctxRoot *os.Root, in dockerfile.Instruction, it copyItem, t copyTarget) error {
	fi, err := ctxRoot.Lstat(it.rel)
	if err != nil {
		return err
	}
	// ADD unpacks a local tar archive (plain or gzip) into the destination.
	if in.Cmd == "ADD" && it.rel == it.src && fi.Mode().IsRegular() {
		if ok, err := s.addArchive(ctxRoot, it.rel, t.out, t.dir, t.dst, t.uid, t.gid); err != nil {
			return err
		} else if ok {
			return nil
		}
	}
	srcIsDir := false
	if sfi, err := ctxRoot.Lstat(it.src); err == nil && sfi.IsDir() {
		srcIsDir = true
	}
	var target string
	switch {
	case srcIsDir:
		rel, _ := filepath.Rel(it.src, it.rel)
		target = path.Join(t.dst, rel)
	case t.toDir:
		target = path.Join(t.dst, path.Base(it.rel))
	default:
		target = t.dst
	}
	target = strings.TrimPrefix(path.Clean(target), "/")
	if target == "" || target == "." {
		return nil
	}
	if err := mkdirLike(t.out, path.Dir(target), t.lowers); err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		if err := t.out.MkdirAll(target, fi.Mode().Perm()); err != nil {
			return err
		}
	case fi.Mode()&os.ModeSymlink != 0:
		link, err := ctxRoot.Readlink(it.rel)
		if err != nil {
			return err
		}
		t.out.Remove(target)
		if err := t.out.Symlink(link, target); err != nil {
			return err
		}
	case fi.Mode().IsRegular():
		if err := copyInRoot(ctxRoot, it.rel, t.out, target, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	if t.uid >= 0 {
		if err := t.out.Lchown(target, t.uid, t.gid); err != nil {
			return err
		}
	}
	if m := in.Flags["chmod"]; m != "" && fi.Mode()&os.ModeSymlink == 0 {
		mode, err := strconv.ParseUint(m, 8, 32)
		if err != nil || mode > 0o7777 {
			return fmt.Errorf("%w: --chmod=%s", errdefs.ErrInvalid, m)
		}
		if err := t.out.Chmod(target, os.FileMode(mode)); err != nil {
			return err
		}
	}
	return nil
}

// lowerRoots opens the layers under the one st builds next, top first.
func (s *Service) lowerRoots(st *buildState) ([]*os.Root, error) {
	lt, err := s.rootfsOf(st)
	if err != nil {
		return nil, err
	}
	if st.base != layers.HostTemplate {
		defer s.layers.RemoveImageTemplate("build-"+st.key[:12], st.layers)
	}
	var roots []*os.Root
	for _, d := range lt.Layers {
		r, err := os.OpenRoot(d)
		if err != nil {
			for _, r := range roots {
				r.Close()
			}
			return nil, err
		}
		roots = append(roots, r)
	}
	return roots, nil
}

// mkdirLike makes dir and its missing parents in the layer out as they are
// in the layers under it (top first): their mode and owner. A COPY into
// /home/user/app must not give the new layer a /home/user of root's, which
// would hide the user's own from every sandbox of the template.
func mkdirLike(out *os.Root, dir string, lowers []*os.Root) error {
	dir = path.Clean(dir)
	if dir == "." || dir == "/" || dir == "" {
		return nil
	}
	if _, err := out.Lstat(dir); err == nil {
		return nil
	}
	if err := mkdirLike(out, path.Dir(dir), lowers); err != nil {
		return err
	}
	mode, uid, gid := os.FileMode(0o755), 0, 0
	for _, l := range lowers {
		fi, err := l.Stat(dir)
		if err != nil {
			continue
		}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok && fi.IsDir() {
			mode, uid, gid = fi.Mode().Perm(), int(sys.Uid), int(sys.Gid)
		}
		break
	}
	if err := out.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := out.Chmod(dir, mode); err != nil { // past the umask
		return err
	}
	return out.Lchown(dir, uid, gid)
}

func copyInRoot(from *os.Root, src string, to *os.Root, dst string, mode os.FileMode) error {
	in, err := from.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	to.Remove(dst)
	out, err := to.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// idOf reads a --chown part: a number, root (0) or user (1000).
func idOf(s string) (int, error) {
	switch s {
	case "root":
		return 0, nil
	case "user":
		return 1000, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%w: --chown takes numeric ids, root or user, not %q", errdefs.ErrInvalid, s)
	}
	return n, nil
}

// addArchive unpacks the context file rel into the layer being built at dst
// if it is a tar archive, plain or gzip-compressed, and reports whether it
// was. The archive is unpacked by the layer store's unpacker, which refuses
// escapes, devices and oversized content, then cloned into place.
func (s *Service) addArchive(ctxRoot *os.Root, rel string, out *os.Root, layerDir, dst string, uid, gid int) (bool, error) {
	f, err := ctxRoot.Open(rel)
	if err != nil {
		return false, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return false, nil
		}
		defer zr.Close()
		r = zr
	}
	tr := bufio.NewReaderSize(r, 1024)
	head, _ := tr.Peek(512)
	if len(head) < 512 || string(head[257:262]) != "ustar" {
		return false, nil // not a tar archive: copied as a file
	}
	id, _, err := s.layers.AddLayerDigest(context.Background(), tr)
	if err != nil {
		return false, fmt.Errorf("ADD %s: %w", rel, err)
	}
	relDst := strings.TrimPrefix(path.Clean(dst), "/")
	// Through the Root: no component of the destination may lead outside.
	if err := out.MkdirAll(relDst, 0o755); err != nil {
		return false, err
	}
	target := filepath.Join(layerDir, relDst)
	if err := layers.CloneTree(s.layers.LayerDir(id), target); err != nil {
		return false, err
	}
	if uid >= 0 {
		err := filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			return false, err
		}
	}
	return true, nil
}
