package layers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Template is what a sandbox's root file system is made from.
type Template struct {
	Name   string
	Layers []string // read-only layer directories, top first
	Binds  []Bind   // host directories mounted read-only
	Env    map[string]string
	// User and Workdir are the defaults of its processes (image USER and
	// WORKDIR); empty means root in its home.
	User, Workdir string
	// StartCmd runs in the background when a sandbox boots; ReadyCmd must
	// then succeed before the sandbox counts as created.
	StartCmd, ReadyCmd string
	// Setuid lets setuid programs (sudo) raise privileges in its
	// sandboxes (runtime.Spec.Setuid).
	Setuid bool
}

// Bind is a read-only host directory seen inside a sandbox at Target. It is
// part of what a template is made of, so it lives here, with the layers,
// and the runtimes take it from here (runtime.Rootfs).
type Bind struct {
	Source string
	Target string
}

// HostTemplate is the zero-download template: the host's /usr (and /bin, /sbin,
// /lib* where they are not symlinks into /usr) read-only, over a fresh minimal
// root with its own /etc. Nothing private of the host is in it: not its /etc
// files beyond public ones, /root, /home, /var or atoll's data.
const HostTemplate = "host"

// hostSkeletonVersion names the skeleton layer; bump it when its content changes,
// so running sandboxes keep the layer they started with.
const hostSkeletonVersion = "host-v2"

// Template returns the named template, preparing it on first use.
func (s *Store) Template(name string) (Template, error) {
	if name != HostTemplate {
		return Template{}, fmt.Errorf("%w: template %q", errdefs.ErrNotFound, name)
	}
	skel := filepath.Join(s.dir, "templates", hostSkeletonVersion)
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	if _, err := os.Stat(skel); errors.Is(err, os.ErrNotExist) {
		if err := buildHostSkeleton(skel); err != nil {
			return Template{}, fmt.Errorf("building host template: %w", err)
		}
	}
	t := Template{Name: HostTemplate, Layers: []string{skel}}
	for _, d := range hostDirs {
		fi, err := os.Lstat("/" + d)
		if err == nil && fi.IsDir() {
			t.Binds = append(t.Binds, Bind{Source: "/" + d, Target: "/" + d})
		}
	}
	return t, nil
}

// HostTemplateTime is when the host template's own layer was made (zero if it
// has not been made yet).
func (s *Store) HostTemplateTime() time.Time {
	fi, err := os.Stat(filepath.Join(s.dir, "templates", hostSkeletonVersion))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime().UTC()
}

// hostDirs are the host directories a host-template sandbox sees.
var hostDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

const (
	passwd = `root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`
	group = `root:x:0:
tty:x:5:user
users:x:100:user
user:x:1000:
nogroup:x:65534:
`
	shadow = `root:*:19000:0:99999:7:::
user:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
`
	hosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
	nsswitch = `passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
`
	profile = `export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ -n "$BASH_VERSION" ] && [ -f /etc/bash.bashrc ]; then . /etc/bash.bashrc; fi
`
	bashrc = `PS1='\u@\h:\w\$ '
`
	resolv = `# atoll: name resolution arrives with sandbox networking
options ndots:0
`
)

// buildHostSkeleton writes the host template's own layer into a temporary
// directory and renames it into place, so a crash never leaves half a layer.
func buildHostSkeleton(dst string) error {
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := writeSkeleton(tmp); err != nil {
		return err
	}
	if err := mirrorHostDirs(tmp); err != nil {
		return err
	}
	if err := linkHostEtc(tmp); err != nil {
		return err
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// skelDir is a directory of a layer atoll makes, with its mode and owner
// (uid and gid).
type skelDir struct {
	path string
	mode os.FileMode
	uid  int
}

// makeDirs makes dirs under root, each with its mode and owner.
func makeDirs(root string, dirs []skelDir) error {
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
		if err := os.Lchown(p, d.uid, d.uid); err != nil {
			return err
		}
	}
	return nil
}

// writeSkeleton makes, in tmp (the layer being built), the directories and /etc files of atoll's
// own making: users, hosts, resolver and shell setup.
func writeSkeleton(tmp string) error {
	dirs := []skelDir{
		{"", 0o755, 0}, {"etc", 0o755, 0}, {"etc/ssl/certs", 0o755, 0}, {"etc/alternatives", 0o755, 0},
		{"root", 0o700, 0}, {"home", 0o755, 0}, {"home/user", 0o755, 1000},
		{"tmp", 0o1777, 0}, {"var", 0o755, 0}, {"var/tmp", 0o1777, 0}, {"var/lib", 0o755, 0},
		{"var/cache", 0o755, 0}, {"var/log", 0o755, 0}, {"run", 0o755, 0}, {"mnt", 0o755, 0},
		{"opt", 0o755, 0}, {"srv", 0o755, 0}, {"proc", 0o555, 0}, {"sys", 0o555, 0},
		{"dev", 0o755, 0},
	}
	if err := makeDirs(tmp, dirs); err != nil {
		return err
	}
	files := []struct {
		path, content string
		mode          os.FileMode
	}{
		{"etc/passwd", passwd, 0o644}, {"etc/group", group, 0o644}, {"etc/shadow", shadow, 0o640},
		{"etc/hosts", hosts, 0o644}, {"etc/hostname", "sandbox\n", 0o644},
		{"etc/resolv.conf", resolv, 0o644}, {"etc/nsswitch.conf", nsswitch, 0o644},
		{"etc/profile", profile, 0o644}, {"etc/bash.bashrc", bashrc, 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(tmp, f.path), []byte(f.content), f.mode); err != nil {
			return err
		}
	}
	return nil
}

// mirrorHostDirs makes, in tmp, each of hostDirs as the host has it: a
// symlink to the same target or an empty directory to mount over.
func mirrorHostDirs(tmp string) error {
	for _, d := range hostDirs {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(tmp, d)); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// linkHostEtc copies and links into tmp's /etc the host's pieces that
// programs from its /usr expect.
func linkHostEtc(tmp string) error {
	// Public pieces of the host's /etc that programs from its /usr expect:
	// the CA bundle, the dynamic linker's cache, the alternatives symlinks
	// (awk, which, editor...) and os-release.
	copies := []string{"ssl/certs/ca-certificates.crt", "ld.so.cache", "ld.so.conf"}
	for _, c := range copies {
		if err := copyFile(filepath.Join("/etc", c), filepath.Join(tmp, "etc", c)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if ents, err := os.ReadDir("/etc/alternatives"); err == nil {
		for _, e := range ents {
			if e.Type()&os.ModeSymlink == 0 {
				continue
			}
			target, err := os.Readlink(filepath.Join("/etc/alternatives", e.Name()))
			if err != nil || !filepath.IsAbs(target) {
				continue
			}
			if err := os.Symlink(target, filepath.Join(tmp, "etc/alternatives", e.Name())); err != nil {
				return err
			}
		}
	}
	links := map[string]string{
		"etc/os-release":              "../usr/lib/os-release",
		"etc/localtime":               "/usr/share/zoneinfo/Etc/UTC",
		"etc/mtab":                    "/proc/self/mounts",
		"etc/ssl/certs/ca-bundle.crt": "ca-certificates.crt",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(tmp, name)); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// syncTree flushes a freshly written directory tree before it is renamed into
// place.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Type()&os.ModeSymlink != 0 {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// ImageTemplate returns the template made of an imported image's layers
// (layerIDs bottom first) under a small layer of atoll's own: mountpoints, a
// fresh /etc/hosts and /etc/resolv.conf, and the unprivileged "user" (uid 1000)
// that every template has, added to the image's passwd and group files. That
// top layer is made once per template and kept with it.
func (s *Store) ImageTemplate(name string, layerIDs []string) (Template, error) {
	top := s.imageTopDir(name, layerIDs)
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	var dirs []string
	seen := map[string]bool{}
	for i := len(layerIDs) - 1; i >= 0; i-- {
		// A layer listed twice needs only its upper place: it puts back
		// whatever the layers between changed of its own files.
		if seen[layerIDs[i]] {
			continue
		}
		seen[layerIDs[i]] = true
		if !s.HasLayer(layerIDs[i]) {
			return Template{}, fmt.Errorf("%w: layer %s of template %s is missing", errdefs.ErrNotFound, layerIDs[i], name)
		}
		dirs = append(dirs, s.LayerDir(layerIDs[i]))
	}
	if _, err := os.Stat(top); errors.Is(err, os.ErrNotExist) {
		if err := buildImageTop(top, dirs); err != nil {
			return Template{}, fmt.Errorf("building template layer: %w", err)
		}
	}
	return Template{Name: name, Layers: append([]string{top}, dirs...)}, nil
}

// RemoveImageTemplate deletes the top layer ImageTemplate made.
func (s *Store) RemoveImageTemplate(name string, layerIDs []string) error {
	return os.RemoveAll(s.imageTopDir(name, layerIDs))
}

func (s *Store) imageTopDir(name string, layerIDs []string) string {
	return filepath.Join(s.dir, "templates", ImageTemplateKey(name, layerIDs))
}

// ImageTemplateKey names the top layer ImageTemplate makes for template
// name over layerIDs: versions of a name with the same layers share it.
func ImageTemplateKey(name string, layerIDs []string) string {
	h := sha256.Sum256([]byte(strings.Join(layerIDs, ",")))
	return "image-" + name + "-" + hex.EncodeToString(h[:6])
}

// SweepImageTemplates removes the top layers ImageTemplate made whose keys
// (ImageTemplateKey) keep lacks, and what a crash left of one half made.
// The caller knows that no template it keeps uses them.
func (s *Store) SweepImageTemplates(keep map[string]bool) error {
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	ents, err := os.ReadDir(filepath.Join(s.dir, "templates"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "image-") || keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, "templates", e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// findInLayers returns the content of the regular file rel as the overlay of
// dirs (top first) shows it, or nil.
func findInLayers(dirs []string, rel string) []byte {
	for _, d := range dirs {
		fi, err := os.Lstat(filepath.Join(d, rel))
		if err != nil {
			continue
		}
		if !fi.Mode().IsRegular() {
			return nil // a whiteout or something else hides lower layers
		}
		b, err := os.ReadFile(filepath.Join(d, rel))
		if err != nil {
			return nil
		}
		return b
	}
	return nil
}

func buildImageTop(dst string, dirs []string) error {
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	err := makeDirs(tmp, []skelDir{{"", 0o755, 0}, {"etc", 0o755, 0}, {"home", 0o755, 0}, {"home/user", 0o755, 1000},
		{"proc", 0o555, 0}, {"sys", 0o555, 0}, {"dev", 0o755, 0}})
	if err != nil {
		return err
	}
	passwdFile := string(findInLayers(dirs, "etc/passwd"))
	if passwdFile == "" {
		passwdFile = "root:x:0:0:root:/root:/bin/sh\n"
	}
	if !hasEntry(passwdFile, "user") {
		passwdFile = withNewline(passwdFile) + "user:x:1000:1000:user:/home/user:/bin/sh\n"
	}
	groupFile := string(findInLayers(dirs, "etc/group"))
	if groupFile == "" {
		groupFile = "root:x:0:\n"
	}
	if !hasEntry(groupFile, "user") {
		groupFile = withNewline(groupFile) + "user:x:1000:\n"
	}
	for _, f := range []struct{ path, content string }{
		{"etc/passwd", passwdFile}, {"etc/group", groupFile}, {"etc/hosts", hosts}, {"etc/resolv.conf", resolv},
	} {
		if err := os.WriteFile(filepath.Join(tmp, f.path), []byte(f.content), 0o644); err != nil {
			return err
		}
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func hasEntry(file, name string) bool {
	for _, line := range strings.Split(file, "\n") {
		if strings.HasPrefix(line, name+":") {
			return true
		}
	}
	return false
}

func withNewline(s string) string {
	if s != "" && !strings.HasSuffix(s, "\n") {
		return s + "\n"
	}
	return s
}
