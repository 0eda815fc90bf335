package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// buildOptions are the flags of "atoll template build".
type buildOptions struct {
	name       string
	file       string   // -f: the Dockerfile, relative to the current directory
	buildArgs  []string // K=V, or K to take V from the environment
	lookupEnv  func(string) (string, bool)
	ignoreFile string // name of the ignore file in DIR
}

func newTemplateBuildCmd(g *globals) *cobra.Command {
	opts := buildOptions{lookupEnv: os.LookupEnv, ignoreFile: ".dockerignore"}
	cmd := &cobra.Command{
		Use:   "build [-f DOCKERFILE] --name NAME [--build-arg K=V]... DIR",
		Short: "Build a template from a Dockerfile",
		Long: `Build template NAME from a Dockerfile and print NAME when done.

DIR is the build context: its files are tarred on the fly and uploaded to the
server, which runs the build. Regular files, directories and symbolic links (as
links, never followed) are sent; sockets, devices and FIFOs are left out.

The Dockerfile is DIR/Dockerfile unless -f names another. -f is a path relative
to the current directory, as with docker build, and must lie inside DIR.

A .dockerignore file in DIR leaves files out of the context: one pattern per
line, relative to DIR; blank lines and lines starting with # are ignored; a
pattern starting with ! brings back what an earlier one left out; the last
pattern that matches a path decides. A pattern that matches a directory leaves
out all of it. Patterns use Go's filepath.Match syntax (*, ?, [a-z], \), so
"**" matches within one path element only, unlike docker's. The Dockerfile is
sent even when a pattern matches it.

--build-arg K=V sets the Dockerfile's ARG K; --build-arg K takes V from the
environment, and is skipped when K is not set there. Build steps and the output
of RUN steps go to standard error as they happen.`,
		Example: `  atoll template build --name myapp .
  atoll template build -f docker/Dockerfile.dev --name myapp-dev --build-arg VERSION=1.2 .
  PIP_INDEX_URL=https://pypi.example atoll template build --build-arg PIP_INDEX_URL --name py ./py`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return runBuild(cmd.Context(), c, args[0], opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.name, "name", "", "name of the new template (required)")
	f.StringVarP(&opts.file, "file", "f", "", `the Dockerfile, inside DIR (default "DIR/Dockerfile")`)
	f.StringArrayVar(&opts.buildArgs, "build-arg", nil, "set ARG K to V (K=V), or to $K (K); repeatable")
	cmd.MarkFlagRequired("name")
	return cmd
}

// errBuildEnded stops the writer of a build context the build no longer reads.
var errBuildEnded = errors.New("build ended")

// runBuild builds dir as described by "atoll template build --help".
func runBuild(ctx context.Context, c *atoll.Client, dir string, opts buildOptions, stdout, stderr io.Writer) error {
	bc, err := newBuildContext(dir, opts.file, opts.ignoreFile)
	if err != nil {
		return err
	}
	args, err := parseBuildArgs(opts.buildArgs, opts.lookupEnv)
	if err != nil {
		return err
	}
	bopts := atoll.BuildOptions{Dockerfile: bc.dockerfile, BuildArgs: args}

	pr, pw := io.Pipe()
	tarErr := make(chan error, 1)
	go func() {
		err := bc.write(pw)
		pw.CloseWithError(err)
		tarErr <- err
	}()
	out := &buildOutput{w: stderr}
	t, err := c.BuildTemplate(ctx, opts.name, bopts, pr, out.event)
	pr.CloseWithError(errBuildEnded) // stops the writer if the build ended early
	out.finish()
	terr := <-tarErr
	// A server that refuses early (a name taken) answers before it has read
	// the whole context, and the HTTP client may close the body before the
	// line above does: its answer is what went wrong, not the send.
	if err != nil && (terr == nil || errors.Is(terr, errBuildEnded) || errors.Is(terr, io.ErrClosedPipe)) {
		return fmt.Errorf("building %s: %w", opts.name, err)
	}
	if terr != nil && !errors.Is(terr, errBuildEnded) {
		return fmt.Errorf("sending the build context %s: %w", dir, terr)
	}
	if err != nil {
		return fmt.Errorf("building %s: %w", opts.name, err)
	}
	fmt.Fprintln(stdout, t.Name)
	return nil
}

// buildContext is a directory to send as a build context.
type buildContext struct {
	root       string // the directory walked, symbolic links resolved
	dockerfile string // slash-separated, relative to root
	ignore     []ignorePattern
}

// newBuildContext checks a build's directory and Dockerfile (relative to the
// current directory; "" for dir/Dockerfile) and reads dir's ignore file.
func newBuildContext(dir, dockerfile, ignoreFile string) (*buildContext, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory: want the build context", dir)
	}
	if dockerfile == "" {
		dockerfile = filepath.Join(dir, "Dockerfile")
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	absFile, err := filepath.Abs(dockerfile)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(absDir, absFile)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("the Dockerfile %s is not inside the build context %s", dockerfile, dir)
	}
	fi, err = os.Lstat(absFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: no such file; name the Dockerfile with -f", dockerfile)
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("the Dockerfile %s is not a regular file", dockerfile)
	}
	bc := &buildContext{dockerfile: filepath.ToSlash(rel)}
	// The context is what dir names; a link to it is not sent as a link.
	if bc.root, err = filepath.EvalSymlinks(absDir); err != nil {
		return nil, err
	}
	// Links are sent as links: a Dockerfile reached through one would not be
	// in the context at the path sent.
	realFile, err := filepath.EvalSymlinks(absFile)
	if err != nil {
		return nil, err
	}
	if realRel, err := filepath.Rel(bc.root, realFile); err != nil || realRel != rel {
		return nil, fmt.Errorf("the Dockerfile %s is reached through a symbolic link; name it by its path inside %s", dockerfile, dir)
	}
	if ignoreFile != "" {
		b, err := os.ReadFile(filepath.Join(bc.root, ignoreFile))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if bc.ignore, err = parseIgnore(string(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ignoreFile), err)
		}
	}
	return bc, nil
}

// write writes the build context to w as a tar stream.
func (bc *buildContext) write(w io.Writer) error {
	negations := false
	for _, p := range bc.ignore {
		negations = negations || p.negate
	}
	return writeTarFunc(w, bc.root, func(rel string, d fs.DirEntry) (bool, error) {
		if rel == bc.dockerfile || !ignored(bc.ignore, rel) {
			return true, nil
		}
		if d.IsDir() && !negations && !strings.HasPrefix(bc.dockerfile, rel+"/") {
			return false, fs.SkipDir
		}
		return false, nil // a ! pattern or the Dockerfile may want something inside
	})
}

// ignorePattern is one line of a .dockerignore file.
type ignorePattern struct {
	pattern string // filepath.Match pattern, slash-separated, relative
	negate  bool   // a ! line: matching paths are sent after all
}

func parseIgnore(s string) ([]ignorePattern, error) {
	var ps []ignorePattern
	sc := bufio.NewScanner(strings.NewReader(s))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var p ignorePattern
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			p.negate, line = true, strings.TrimSpace(rest)
		}
		p.pattern = strings.TrimPrefix(path.Clean(filepath.ToSlash(line)), "/")
		if _, err := path.Match(p.pattern, ""); err != nil {
			return nil, fmt.Errorf("line %d: %q: %w", n, line, err)
		}
		ps = append(ps, p)
	}
	return ps, sc.Err()
}

// ignored reports whether ps leave rel out: the last pattern matching rel or
// one of its parent directories decides.
func ignored(ps []ignorePattern, rel string) bool {
	out := false
	for _, p := range ps {
		if matchesPathOrParent(p.pattern, rel) {
			out = !p.negate
		}
	}
	return out
}

func matchesPathOrParent(pattern, rel string) bool {
	for p := rel; p != "." && p != "/"; p = path.Dir(p) {
		if ok, _ := path.Match(pattern, p); ok {
			return true
		}
	}
	return false
}

// buildOutput shows a build's events: a line per step, and the output of RUN
// steps as it comes.
type buildOutput struct {
	w       io.Writer
	midLine bool // the last output did not end in a newline
}

func (o *buildOutput) event(ev api.BuildEvent) {
	switch ev.Type {
	case "step":
		o.finish()
		steps := ""
		if ev.Steps > 0 {
			steps = fmt.Sprintf("/%d", ev.Steps)
		}
		cached := ""
		if ev.Cached {
			cached = " (cached)"
		}
		fmt.Fprintf(o.w, "Step %d%s: %s%s\n", ev.Step, steps, ev.Instruction, cached)
	case "log":
		if len(ev.Data) > 0 {
			o.w.Write(ev.Data)
			o.midLine = ev.Data[len(ev.Data)-1] != '\n'
		}
	}
}

// finish ends a line the output left open.
func (o *buildOutput) finish() {
	if o.midLine {
		fmt.Fprintln(o.w)
		o.midLine = false
	}
}

// parseBuildArgs reads --build-arg values: K=V, or K for $K (left out
// when unset, as docker build does).
func parseBuildArgs(kvs []string, lookupEnv func(string) (string, bool)) (map[string]string, error) {
	args := make(map[string]string)
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("--build-arg %q: want K=V or K", kv)
		}
		if !ok {
			if v, ok = lookupEnv(k); !ok {
				continue
			}
		}
		args[k] = v
	}
	return args, nil
}
