package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template COMMAND",
		Aliases: []string{"templates"},
		Short:   "Manage templates: the images sandboxes start from",
		Long: `Manage templates, the root filesystems sandboxes start from. "host" is built in;
others are container images imported from a registry or from a "docker save" or
OCI archive, or built from a Dockerfile. "atoll create --template NAME" starts a
sandbox from one.

A name points to a version. Building or importing under a name that exists makes
a new version and moves the name to it, while sandboxes run: each sandbox keeps
the version it was made from (across restarts, archives and forks), new ones get
the new version, and "--template NAME@VERSION" (a number or ID) starts from an
older one while it exists. A version goes once nothing uses it.`,
		Example: `  atoll template import docker.io/library/python:3.12-slim --name python
  atoll template build --name myapp .
  atoll template ls
  atoll create --template python`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newTemplateImportCmd(g), newTemplateBuildCmd(g), newTemplateLsCmd(g), newTemplateInspectCmd(g), newTemplateRmCmd(g), newTemplateTagCmd(g), newTemplateBootstrapCmd(g))
	return cmd
}

// importOptions are the flags of "atoll template import".
type importOptions struct {
	name          string
	username      string
	passwordStdin bool
	insecure      bool
}

func newTemplateImportCmd(g *globals) *cobra.Command {
	var opts importOptions
	cmd := &cobra.Command{
		Use:   "import REF|FILE.tar|DIR|- --name NAME [flags]",
		Short: "Import an image from a registry or an archive as a template",
		Long: `Import a container image as template NAME and print NAME when done.

The source is, in this order:
  - "-": a "docker save" or OCI archive read from standard input;
  - an existing file: a "docker save" or OCI archive, uploaded to the server;
  - an existing directory holding an OCI image layout (with an oci-layout file),
    tarred and uploaded on the fly;
  - otherwise an image reference the server pulls from its registry, e.g.
    docker.io/library/alpine:3.20 or ghcr.io/org/image@sha256:….

Registry credentials are given with --username and --password-stdin, which
reads the password from standard input so that it stays out of the shell's
history and the process list. Progress goes to standard error: a line per layer
redrawn in place on a terminal, plain lines otherwise.

Template names are 1-63 characters of a-z, 0-9, ".", "_" and "-", starting with
a letter or digit.`,
		Example: `  atoll template import docker.io/library/python:3.12-slim --name python
  docker save myapp:latest | atoll template import - --name myapp
  atoll template import ./image.tar --name myapp
  echo "$TOKEN" | atoll template import ghcr.io/org/app:1.2 --name app --username bot --password-stdin
  atoll template import localhost:5000/dev:latest --name dev --insecure`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return runImport(cmd.Context(), c, args[0], opts, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.name, "name", "", "name of the new template (required)")
	f.StringVar(&opts.username, "username", "", "registry user name")
	f.BoolVar(&opts.passwordStdin, "password-stdin", false, "read the registry password from standard input")
	f.BoolVar(&opts.insecure, "insecure", false, "talk to the registry over plain HTTP")
	cmd.MarkFlagRequired("name")
	return cmd
}

// runImport imports src as described by "atoll template import --help".
func runImport(ctx context.Context, c *atoll.Client, src string, opts importOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	archive, closeArchive, err := openArchive(src, stdin)
	if err != nil {
		return err
	}
	defer closeArchive()
	registryFlags := opts.username != "" || opts.passwordStdin || opts.insecure
	if archive != nil && registryFlags {
		return fmt.Errorf("--username, --password-stdin and --insecure are for registry references; %s is an archive", src)
	}
	req := api.ImportTemplateRequest{Name: opts.name, Ref: src, Username: opts.username, Insecure: opts.insecure}
	if opts.passwordStdin {
		if opts.username == "" {
			return errors.New("--password-stdin needs --username")
		}
		b, err := io.ReadAll(io.LimitReader(stdin, 64<<10))
		if err != nil {
			return fmt.Errorf("reading the password from standard input: %w", err)
		}
		req.Password = strings.TrimRight(string(b), "\r\n")
		if req.Password == "" {
			return errors.New("--password-stdin: standard input is empty")
		}
	}

	p := newImportProgress(stderr, isTerminal(stderr))
	var t api.Template
	if archive != nil {
		t, err = c.ImportTemplateArchive(ctx, opts.name, archive, p.event)
	} else {
		t, err = c.ImportTemplate(ctx, req, p.event)
	}
	p.finish(err == nil)
	if err != nil {
		return fmt.Errorf("importing %s: %w", src, err)
	}
	fmt.Fprintln(stdout, t.Name)
	return nil
}

// openArchive returns the archive src names, or nil if src is an image
// reference. release closes the archive and waits for whatever produces it.
func openArchive(src string, stdin io.Reader) (r io.Reader, release func(), err error) {
	if src == "-" {
		return stdin, func() {}, nil
	}
	fi, err := os.Stat(src)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if looksLikePath(src) {
			return nil, nil, fmt.Errorf("%s: no such file or directory", src)
		}
		return nil, func() {}, nil // an image reference
	case err != nil:
		return nil, nil, err
	case fi.Mode().IsRegular():
		f, err := os.Open(src)
		if err != nil {
			return nil, nil, err
		}
		return f, func() { f.Close() }, nil
	case fi.IsDir():
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err != nil {
			return nil, nil, fmt.Errorf("%s is a directory but not an OCI image layout (it has no oci-layout file)", src)
		}
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			pw.CloseWithError(writeTar(pw, src))
		}()
		return pr, func() {
			pr.CloseWithError(errors.New("import ended"))
			<-done
		}, nil
	}
	return nil, nil, fmt.Errorf("%s is neither a file nor a directory", src)
}

// looksLikePath reports whether src is meant as a file rather than an image
// reference, which never starts with "/" or "." nor ends in ".tar".
func looksLikePath(src string) bool {
	return strings.HasPrefix(src, "/") || strings.HasPrefix(src, ".") || strings.HasPrefix(src, "~") ||
		strings.HasSuffix(src, ".tar") || strings.HasSuffix(src, ".tar.gz") || strings.HasSuffix(src, ".tgz")
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// importProgress shows an import's progress: on a terminal one line per
// layer, redrawn in place; otherwise one plain line per layer as it finishes.
type importProgress struct {
	w     io.Writer
	tty   bool
	every time.Duration // least time between redraws on a terminal
	now   func() time.Time

	layers []*layerProgress
	byID   map[string]*layerProgress
	done   int // the LayersDone last reported
	drawn  int // lines on screen from the last redraw
	last   time.Time
}

type layerProgress struct {
	id           string
	bytes, total int64
	done         bool
	printed      bool // plain mode: its line is out
}

func newImportProgress(w io.Writer, tty bool) *importProgress {
	return &importProgress{w: w, tty: tty, every: 100 * time.Millisecond, now: time.Now, byID: make(map[string]*layerProgress)}
}

func (p *importProgress) event(ev api.ImportEvent) {
	if ev.Layer == "" {
		return
	}
	l := p.byID[ev.Layer]
	isNew := l == nil
	if isNew {
		l = &layerProgress{id: ev.Layer}
		p.byID[ev.Layer] = l
		p.layers = append(p.layers, l)
	}
	l.bytes = ev.Bytes
	if ev.Total > 0 {
		l.total = ev.Total
	}
	wasDone := l.done
	if (l.total > 0 && l.bytes >= l.total) || ev.LayersDone > p.done {
		l.done = true
	}
	p.done = max(p.done, ev.LayersDone)
	if !p.tty {
		p.printDone()
		return
	}
	if isNew || l.done != wasDone || p.now().Sub(p.last) >= p.every {
		p.redraw()
	}
}

// finish draws the final state; ok marks every layer done.
func (p *importProgress) finish(ok bool) {
	if ok {
		for _, l := range p.layers {
			l.done = true
		}
	}
	if p.tty {
		p.redraw()
	} else {
		p.printDone()
	}
}

func (p *importProgress) printDone() {
	for _, l := range p.layers {
		if l.done && !l.printed {
			fmt.Fprintln(p.w, p.line(l))
			l.printed = true
		}
	}
}

func (p *importProgress) redraw() {
	if len(p.layers) == 0 {
		return
	}
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn) // back to the first line
	}
	for _, l := range p.layers {
		b.WriteString("\r\x1b[K")
		b.WriteString(p.line(l))
		b.WriteByte('\n')
	}
	io.WriteString(p.w, b.String())
	p.drawn = len(p.layers)
	p.last = p.now()
}

func (p *importProgress) line(l *layerProgress) string {
	id := shortLayer(l.id)
	switch {
	case l.done:
		return fmt.Sprintf("%-12s  %s  done", id, formatBytes(l.bytes))
	case l.total > 0:
		return fmt.Sprintf("%-12s  %s / %s  %d%%", id, formatBytes(l.bytes), formatBytes(l.total), l.bytes*100/l.total)
	}
	return fmt.Sprintf("%-12s  %s", id, formatBytes(l.bytes))
}

// shortLayer is a layer ID as people read it: the first 12 hex digits of a
// digest (with or without "sha256:"), or a long name cut short.
func shortLayer(id string) string {
	hex := strings.TrimPrefix(id, "sha256:")
	if len(hex) > 12 && strings.Trim(hex, "0123456789abcdef") == "" {
		return hex[:12]
	}
	if len(id) > 40 {
		return id[:39] + "…"
	}
	return id
}

func newTemplateLsCmd(g *globals) *cobra.Command {
	return templateListing.command(g, &cobra.Command{
		Use:   "ls [flags]",
		Short: "List templates",
		Long: `List templates as a table, or as JSON with --json. VERSION is the version the
name points to; OLD counts its earlier versions that sandboxes or snapshots still
use (a name removed while in use shows as removed until they go). SANDBOXES
counts the sandboxes made from each template, of any version; SIZE is its
layers' unpacked size.`,
		Example: `  atoll template ls
  atoll template ls --json | jq -r '.templates[] | select(.sandboxes == 0) | .name'`,
		Args: cobra.NoArgs,
	}, "names", func(ctx context.Context, c *atoll.Client, _ []string) ([]api.Template, error) {
		return c.ListTemplates(ctx)
	})
}

var templateListing = listing[api.Template]{
	json:  func(ts []api.Template) any { return api.TemplateList{Templates: ts} },
	key:   func(t api.Template) string { return t.Name },
	table: renderTemplates,
	order: func(a, b api.Template) int { return strings.Compare(a.Name, b.Name) },
}

func newTemplateInspectCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a template's details",
		Long: `Show a template's current version: its source, digest, size and layers, and the
image configuration (environment, working directory, user, entrypoint, command)
its sandboxes start with; then every version still held, with the sandboxes and
snapshots that use it. "atoll create --template NAME@VERSION" starts from an
older version while it exists. --json shows it as the API does.`,
		Example: `  atoll template inspect python
  atoll template inspect python --json`,
		Args: cobra.ExactArgs(1),
	}, "print JSON", byID((*atoll.Client).GetTemplate), func(w io.Writer, t api.Template) error { return renderTemplate(w, t, time.Now()) })
}

func newTemplateRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove template names",
		Long: `Remove template names. A version of the name that sandboxes, snapshots or
other names still use stays until the last of them goes, and the output says so;
a version nothing uses goes at once, with the layers no other version shares.`,
		Example: `  atoll template rm python
  atoll template ls -q | grep '^test-' | xargs atoll template rm`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := false
			for _, name := range args {
				rm, err := c.DeleteTemplate(cmd.Context(), name)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "atoll: %s: %v\n", name, err)
					failed = true
					continue
				}
				renderRemoved(cmd.OutOrStdout(), rm)
			}
			if failed {
				return exitError{1}
			}
			return nil
		},
	}
}

// renderRemoved writes a removed name, and which of its versions stay and
// why.
func renderRemoved(w io.Writer, rm api.TemplateRemoved) {
	fmt.Fprintln(w, rm.Name)
	for _, v := range rm.Held {
		var by []string
		if v.Sandboxes > 0 {
			by = append(by, plural(v.Sandboxes, "sandbox", "sandboxes"))
		}
		if v.Snapshots > 0 {
			by = append(by, plural(v.Snapshots, "snapshot", "snapshots"))
		}
		if len(by) == 0 {
			by = append(by, "another name")
		}
		fmt.Fprintf(w, "  version %d (%s) stays until unused: used by %s\n", v.Number, v.ID, strings.Join(by, " and "))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

func newTemplateTagCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tag NAME NEWNAME",
		Short: "Give a template a second name",
		Long: `Point NEWNAME at the current version of NAME (or at NAME@VERSION): an alias,
or a name to keep a version by. Removing one name leaves the other. What NEWNAME
pointed to before stays while sandboxes use it.`,
		Example: `  atoll template tag python python-2026-11
  atoll template build --name python-next ./py && atoll template tag python-next python`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printKey(g, cmd, func(ctx context.Context, c *atoll.Client) (api.Template, error) {
				return c.TagTemplate(ctx, args[0], args[1])
			}, templateListing.key)
		},
	}
}

func newTemplateBootstrapCmd(g *globals) *cobra.Command {
	req := api.BootstrapTemplateRequest{}
	var buildArgs []string
	cmd := &cobra.Command{
		Use:   "bootstrap debian|base|code-interpreter [--name NAME]",
		Short: "Make a Debian template, or one of atoll's own templates, with debootstrap",
		Long: `Make a template on the server with debootstrap, from a Debian package mirror:
a real Debian with apt, for servers that cannot reach an image registry.

"debian" makes the bootstrapped system the template (--name is required).
"base" builds atoll's templates/base/Dockerfile over it: E2B's default
template, with python, node and npm, curl, git, and the user "user" with
passwordless sudo. It is named base unless --name says otherwise, and the E2B
API's template "base" then means it (instead of the host template).
"code-interpreter" builds templates/code-interpreter over it: E2B's code
interpreter service on port 49999 (Python, bash and deno's JavaScript and
TypeScript Jupyter kernels, matplotlib, pandas), which the code-interpreter SDK's default template code-interpreter-v1
and atoll run-code use.

The server needs the debootstrap package; "base" and "code-interpreter" also
need its sandboxes to reach the mirror (networking on), and
"code-interpreter" the npm registry, whence deno comes (--build-arg
NPM_REGISTRY=URL names a mirror of it; an empty value leaves JavaScript out).
--build-arg sets an ARG of the Dockerfile built, as with atoll template build.
The log streams to stderr; the template's name is printed when it is ready.`,
		Example: `  atoll template bootstrap base
  atoll template bootstrap code-interpreter --build-arg NPM_REGISTRY=https://npm.example/
  atoll template bootstrap debian --name debian
  atoll template bootstrap debian --name trixie --suite trixie --mirror http://deb.debian.org/debian`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Distro = args[0]
			if req.Distro != "debian" {
				// atoll's own templates are built over Debian.
				req.Distro, req.Build = "debian", args[0]
				if req.Name == "" {
					req.Name = args[0]
				}
			}
			if req.Name == "" {
				return errors.New(`required flag "name" not set`)
			}
			if len(buildArgs) > 0 && req.Build == "" {
				return errors.New("--build-arg: debian builds no Dockerfile")
			}
			if len(buildArgs) > 0 {
				args, err := parseBuildArgs(buildArgs, os.LookupEnv)
				if err != nil {
					return err
				}
				req.BuildArgs = args
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out := &buildOutput{w: cmd.ErrOrStderr()}
			t, err := c.BootstrapTemplate(cmd.Context(), req, out.event)
			out.finish()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "name of the template (required for debian; default the name of the template built)")
	f.StringVar(&req.Suite, "suite", "bookworm", "Debian suite")
	f.StringVar(&req.Mirror, "mirror", "http://deb.debian.org/debian", "Debian mirror URL")
	f.StringVar(&req.Variant, "variant", "minbase", "debootstrap variant: minbase or buildd")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "set ARG K of the Dockerfile built to V (K=V), or to $K (K); repeatable")
	return cmd
}
