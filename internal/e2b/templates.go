package e2b

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/dockerfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Templates is the part of atoll's template service (templates.Service)
// E2B's template SDK uses: builds from steps, the files their COPY steps
// upload, and names. Errors carry errdefs kinds.
type Templates interface {
	BuildSteps(ctx context.Context, name string, ins []dockerfile.Instruction, events func(api.BuildEvent)) (api.Template, error)
	AddBuildFiles(ctx context.Context, hash string, r io.Reader) error
	HasBuildFiles(hash string) bool
	Get(ctx context.Context, name string) (api.Template, error)
	List(ctx context.Context) ([]api.Template, error)
	Tag(ctx context.Context, ref, tag string) (api.Template, error)
	Delete(ctx context.Context, name string) (api.TemplateRemoved, error)
}

// E2B's template SDK builds in four calls: POST /v3/templates names the
// template and gets a build ID; GET /templates/{id}/files/{hash}, for each
// COPY step, asks whether the server has its files and where to upload them
// if not (the SDK PUTs a tar to that URL, without its API key); POST
// /v2/templates/{id}/builds/{buildID} sends the steps and starts the build;
// GET .../status polls it, with its logs from an offset. atoll keeps the
// record of each build in memory (a restart forgets them, as it ends the
// builds), translates the steps into the instructions of its own build
// engine, and records the result as a version of an atoll template.

// MaxUploadBody is the largest build files upload read (compressed); what
// it unpacks to is bounded by the layer store's limits.
const MaxUploadBody = 4 << 30

// Builds are forgotten this long after they end, and at most maxBuilds are
// kept: the oldest finished go first.
const (
	buildRecordTTL = time.Hour
	maxBuilds      = 256
	maxBuildLogs   = 20000
	uploadURLTTL   = time.Hour
)

// Build statuses, as E2B names them.
const (
	statusWaiting  = "waiting"  // requested, steps not sent yet
	statusBuilding = "building" // running
	statusReady    = "ready"
	statusError    = "error"
)

type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

// build is one requested build.
type build struct {
	id       string
	name     string   // E2B template name: atoll's name for the default tag
	tags     []string // E2B tags; "default" is the name itself
	created  time.Time
	mu       sync.Mutex
	status   string
	logs     []logEntry
	reason   *buildReason
	ended    time.Time
	version  string // atoll version ID, when ready
	partial  []byte // an unfinished output line
	stepName string // E2B step of the instruction running
	stepText string // and the instruction
}

// engineStep is how atoll's build engine names the instruction that
// failed, and exitedWith how it says a RUN step's command failed.
var (
	engineStep = regexp.MustCompile(`^step [0-9]+ \([A-Z]+\): `)
	exitedWith = regexp.MustCompile(`the command exited with ([0-9]+)`)
)

func (b *build) log(level, step, msg string) {
	if len(b.logs) >= maxBuildLogs {
		return
	}
	b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
	if len(b.logs) == maxBuildLogs {
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: "(further output not kept)", Step: step})
	}
}

// builds holds the build records and owns the goroutines that run them.
type builds struct {
	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	byID   map[string]*build
}

func newBuilds() *builds {
	ctx, cancel := context.WithCancel(context.Background())
	return &builds{ctx: ctx, cancel: cancel, byID: map[string]*build{}}
}

func (bs *builds) close() {
	bs.cancel()
	bs.wg.Wait()
}

func (bs *builds) add(b *build) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	now := time.Now()
	var done []*build
	for id, o := range bs.byID {
		o.mu.Lock()
		ended := o.ended
		o.mu.Unlock()
		if !ended.IsZero() && now.Sub(ended) > buildRecordTTL {
			delete(bs.byID, id)
		} else if !ended.IsZero() {
			done = append(done, o)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].created.Before(done[j].created) })
	for len(bs.byID) >= maxBuilds && len(done) > 0 {
		delete(bs.byID, done[0].id)
		done = done[1:]
	}
	bs.byID[b.id] = b
}

func (bs *builds) get(id string) (*build, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b, ok := bs.byID[id]
	return b, ok
}

// buildIDOf is the ID of the build that made atoll version v, if this
// server ran it: E2B's tags name builds.
func (bs *builds) buildIDOf(v string) string {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range bs.byID {
		b.mu.Lock()
		match := v != "" && b.version == v
		b.mu.Unlock()
		if match {
			return b.id
		}
	}
	return uuidOf([]byte(v))
}

// newUUID returns a random UUID (version 4), E2B's form of build IDs.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	return formatUUID(b[:])
}

// uuidOf is a UUID made from a hash of b: the build ID of a version this
// server did not build through E2B's API, stable across calls.
func uuidOf(b []byte) string {
	h := sha256.Sum256(b)
	return formatUUID(h[:16])
}

func formatUUID(b []byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b)
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// templateRoutes adds E2B's template routes, when the server builds.
func (s *Server) templateRoutes() {
	if s.cfg.Templates == nil {
		return
	}
	auth := func(h http.HandlerFunc) http.Handler { return s.authenticate(h) }
	admin := func(h http.HandlerFunc) http.Handler { return s.authenticate(s.adminOnly(h)) }
	m := s.api
	m.Handle("POST /v3/templates", admin(s.requestBuild))
	m.Handle("GET /templates/{templateID}/files/{hash}", admin(s.fileUploadLink))
	// Authorised by the URL's signature, as E2B's presigned storage URLs
	// are: the SDK sends no key with the upload.
	m.HandleFunc("PUT /templates/{templateID}/files/{hash}", s.uploadFiles)
	m.Handle("POST /v2/templates/{templateID}/builds/{buildID}", admin(s.startBuild))
	m.Handle("GET /templates/{templateID}/builds/{buildID}/status", admin(s.buildStatus))
	m.Handle("POST /templates/tags", admin(s.assignTags))
	m.Handle("DELETE /templates/tags", admin(s.removeTags))
	// GET /templates/{templateID}/tags and GET /templates/aliases/{alias}
	// overlap, which ServeMux refuses: one pattern serves both.
	m.Handle("GET /templates/{first}/{second}", auth(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.PathValue("first") == "aliases":
			s.aliasExists(w, r, r.PathValue("second"))
		case r.PathValue("second") == "tags":
			s.templateTags(w, r, r.PathValue("first"))
		default:
			writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		}
	}))
}

// adminOnly refuses keys other than the admin's: atoll's templates are the
// server's, shared by every tenant, so only the admin adds or changes them
// (E2B's templates are a team's own).
func (s *Server) adminOnly(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if t, ok := tenant.FromContext(r.Context()); !ok || !tenant.IsAdmin(t) {
			writeError(w, http.StatusForbidden, "templates are shared by every tenant on atoll: only an admin key builds, uploads or tags them")
			return
		}
		next(w, r)
	}
}

var (
	e2bNamePattern = regexp.MustCompile(`^[a-z0-9_-]+$`)
	e2bTagPattern  = regexp.MustCompile(`^[a-z0-9_.-]+$`)
	versionIDShape = regexp.MustCompile(`^v[0-9a-f]{19}$`)
)

const defaultTag = "default"

// parseName reads E2B's "name" or "name:tag", lower case and trimmed as
// E2B reads it; the tag is "" for none or "default". A tag may name an
// atoll version here (NAME:3); checkTag says whether a new one may be made.
func parseName(in string) (name, tag string, err error) {
	in = strings.ToLower(strings.TrimSpace(in))
	name, tag, hasTag := strings.Cut(in, ":")
	if hasTag && tag == "" {
		return "", "", bad("invalid tag in %q: empty", truncate(in))
	}
	if strings.Contains(name, "/") {
		return "", "", bad("template name %q: namespaces (team/name) are not supported by atoll", truncate(in))
	}
	if !e2bNamePattern.MatchString(name) || len(name) > 63 {
		return "", "", bad("invalid template name %q: 1-63 characters of [a-z0-9_-]", truncate(name))
	}
	if tag == defaultTag {
		tag = ""
	}
	if tag != "" && !e2bTagPattern.MatchString(tag) {
		return "", "", bad("invalid tag %q: characters of [a-z0-9_.-]", truncate(tag))
	}
	return name, tag, nil
}

// checkTag accepts E2B's tags that atoll can keep as names: not numbers
// or version IDs, which name atoll's versions in NAME:VERSION.
func checkTag(tag string) error {
	switch {
	case !e2bTagPattern.MatchString(tag):
		return bad("invalid tag %q: characters of [a-z0-9_.-]", truncate(tag))
	case uuidPattern.MatchString(tag):
		return bad("invalid tag %q: a tag cannot be a UUID", truncate(tag))
	case isVersionRef(tag):
		return bad("tag %q names an atoll version (a number or version ID); pick another", truncate(tag))
	}
	return nil
}

func isVersionRef(tag string) bool {
	if _, err := strconv.Atoi(tag); err == nil {
		return true
	}
	return versionIDShape.MatchString(tag)
}

// atollName is the atoll template name of E2B's name:tag: the name itself
// for the default tag, NAME.TAG for others (E2B names have no dots, so
// the first one splits them again).
func atollName(name, tag string) string {
	if tag == "" || tag == defaultTag {
		return name
	}
	return name + "." + tag
}

// atollRef is the atoll reference (for a FROM or a tag) of E2B's name:tag:
// a version for a number or version ID, else atollName.
func atollRef(name, tag string) string {
	if tag != "" && isVersionRef(tag) {
		return name + "@" + tag
	}
	return atollName(name, tag)
}

type requestBuildBody struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	var body requestBuildBody
	if err := decode(w, r, &body, false); err != nil {
		s.writeErr(w, r, err)
		return
	}
	in := body.Name
	if in == "" {
		in = body.Alias
	}
	if in == "" {
		writeError(w, http.StatusBadRequest, "Name is required")
		return
	}
	name, tag, err := parseName(in)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if _, ok := s.cfg.Aliases[name]; ok {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is an alias of an atoll template here; build under another name", name))
		return
	}
	var tags []string
	seen := map[string]bool{}
	for _, t := range append([]string{tag}, body.Tags...) {
		t = strings.ToLower(strings.TrimSpace(t))
		if t == "" && tag == "" && len(body.Tags) > 0 {
			continue // no tag in the name, tags given
		}
		if t == "" {
			t = defaultTag
		}
		if t != defaultTag {
			if err := checkTag(t); err != nil {
				s.writeErr(w, r, err)
				return
			}
		}
		if len(atollName(name, t)) > 63 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("template name and tag %s:%s are longer than 63 characters together", name, truncate(t)))
			return
		}
		if !seen[t] {
			seen[t] = true
			tags = append(tags, t)
		}
	}
	b := &build{id: newUUID(), name: name, tags: tags, created: time.Now(), status: statusWaiting}
	s.builds.add(b)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": b.id, "public": false,
		"names": []string{name}, "aliases": []string{name}, "tags": tags,
	})
}

// uploadSignature authorises the upload of the files hash for template,
// until expires (Unix seconds), with the server's token key.
func (s *Server) uploadSignature(template, hash string, expires int64) string {
	m := hmac.New(sha256.New, s.cfg.TokenKey)
	fmt.Fprintf(m, "e2b-build-files\x00%s\x00%s\x00%d", template, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	template, hash := r.PathValue("templateID"), r.PathValue("hash")
	if _, _, err := parseName(template); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !validFilesHash(hash) {
		writeError(w, http.StatusBadRequest, "malformed files hash: want hex SHA-256")
		return
	}
	// The URL names this server as the client reached it. It comes with
	// files already here too, for copy(…, {forceUpload: true}).
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	expires := time.Now().Add(uploadURLTTL).Unix()
	u := fmt.Sprintf("%s://%s/templates/%s/files/%s?expires=%d&signature=%s", scheme, r.Host, template, hash,
		expires, s.uploadSignature(template, hash, expires))
	writeJSON(w, http.StatusCreated, map[string]any{"present": s.cfg.Templates.HasBuildFiles(hash), "url": u})
}

func validFilesHash(h string) bool {
	return len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
}

func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	template, hash := r.PathValue("templateID"), r.PathValue("hash")
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	sig, _ := hex.DecodeString(q.Get("signature"))
	want, _ := hex.DecodeString(s.uploadSignature(template, hash, expires))
	if err != nil || !hmac.Equal(sig, want) {
		writeError(w, http.StatusForbidden, "invalid upload signature: ask GET /templates/{templateID}/files/{hash} for an upload URL")
		return
	}
	if time.Now().Unix() > expires {
		writeError(w, http.StatusForbidden, "the upload URL has expired")
		return
	}
	if r.ContentLength > MaxUploadBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload is larger than %d bytes", int64(MaxUploadBody)))
		return
	}
	body := http.MaxBytesReader(w, r.Body, MaxUploadBody)
	if err := s.cfg.Templates.AddBuildFiles(r.Context(), hash, body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload is larger than %d bytes", int64(MaxUploadBody)))
			return
		}
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// startBuildBody is E2B's TemplateBuildStartV2.
type startBuildBody struct {
	FromImage         string         `json:"fromImage"`
	FromTemplate      string         `json:"fromTemplate"`
	FromImageRegistry map[string]any `json:"fromImageRegistry"`
	Force             bool           `json:"force"`
	Steps             []templateStep `json:"steps"`
	StartCmd          string         `json:"startCmd"`
	ReadyCmd          string         `json:"readyCmd"`
}

type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

func (s *Server) findBuild(w http.ResponseWriter, r *http.Request) (*build, bool) {
	b, ok := s.builds.get(r.PathValue("buildID"))
	if !ok || b.name != strings.ToLower(r.PathValue("templateID")) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build '%s' of template '%s' not found", truncate(r.PathValue("buildID")), truncate(r.PathValue("templateID"))))
		return nil, false
	}
	return b, true
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	b, ok := s.findBuild(w, r)
	if !ok {
		return
	}
	var body startBuildBody
	if err := decode(w, r, &body, false); err != nil {
		s.writeErr(w, r, err)
		return
	}
	ins, steps, err := s.translate(r.Context(), body)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	b.mu.Lock()
	if b.status != statusWaiting {
		b.mu.Unlock()
		writeError(w, http.StatusConflict, fmt.Sprintf("build '%s' was already started", b.id))
		return
	}
	b.status = statusBuilding
	b.log("info", "base", fmt.Sprintf("Building %s with atoll's builder: %d instructions", atollName(b.name, b.tags[0]), len(ins)))
	b.mu.Unlock()
	s.builds.wg.Add(1)
	go func() {
		defer s.builds.wg.Done()
		s.runBuild(s.builds.ctx, b, ins, steps)
	}()
	w.WriteHeader(http.StatusAccepted)
}

// runBuild runs build b: ins, of which steps[i] is the E2B step.
func (s *Server) runBuild(ctx context.Context, b *build, ins []dockerfile.Instruction, steps []string) {
	primary := atollName(b.name, b.tags[0])
	events := func(ev api.BuildEvent) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev.Type {
		case "step":
			b.flushOutput()
			if ev.Step >= 1 && ev.Step <= len(steps) {
				b.stepName = steps[ev.Step-1]
			}
			b.stepText = ev.Instruction
			msg := fmt.Sprintf("[builder %d/%d] %s", ev.Step, ev.Steps, ev.Instruction)
			if ev.Cached {
				msg = "CACHED " + msg
			}
			b.log("info", b.stepName, msg)
		case "log":
			b.partial = append(b.partial, ev.Data...)
			for {
				i := bytes.IndexByte(b.partial, '\n')
				if i < 0 {
					break
				}
				b.log("info", b.stepName, strings.TrimRight(string(b.partial[:i]), "\r"))
				b.partial = b.partial[i+1:]
			}
		}
	}
	t, err := s.cfg.Templates.BuildSteps(ctx, primary, ins, events)
	if err == nil {
		for _, tag := range b.tags[1:] {
			if _, err = s.cfg.Templates.Tag(ctx, primary+"@"+t.VersionID, atollName(b.name, tag)); err != nil {
				err = fmt.Errorf("tagging %s: %w", tag, err)
				break
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushOutput()
	b.ended = time.Now()
	if err != nil {
		msg := "internal error"
		if kind := errdefs.Kind(err); kind != nil {
			// Without the engine's instruction number, which is not
			// the SDK's step number (reason.step is).
			msg = engineStep.ReplaceAllString(clientMessage(err, kind), "")
			msg = strings.ReplaceAll(msg, kind.Error()+": ", "")
			// In E2B's words, which agent code may match on.
			if cmd, ok := strings.CutPrefix(b.stepText, "RUN "); ok {
				msg = fmt.Sprintf("failed to run command '%s': %s", cmd, exitedWith.ReplaceAllString(msg, "exit status $1"))
			} else if b.stepText != "" {
				msg = b.stepText + ": " + msg
			}
		}
		if msg == "internal error" {
			s.log.Error("e2b template build", "template", primary, "err", err)
		}
		b.status = statusError
		b.log("error", b.stepName, "Build failed: "+msg)
		n := len(b.logs)
		b.reason = &buildReason{Message: msg, Step: b.stepName, LogEntries: append([]logEntry(nil), b.logs[max(0, n-20):]...)}
		return
	}
	b.version = t.VersionID
	b.status = statusReady
	b.log("info", "finalize", fmt.Sprintf("Template %s is version %d (%s) of atoll template %s", b.name, t.Version, t.VersionID, primary))
}

func (b *build) flushOutput() {
	if len(b.partial) > 0 {
		b.log("info", b.stepName, string(b.partial))
		b.partial = nil
	}
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	b, ok := s.findBuild(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	if v := q.Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "logsOffset must be a number from 0")
			return
		}
		offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be a number from 0 to 100")
			return
		}
		limit = n
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	entries := []logEntry{}
	if offset < len(b.logs) {
		entries = b.logs[offset:min(len(b.logs), offset+limit)]
	}
	logs := make([]string, len(entries))
	for i, e := range entries {
		logs[i] = fmt.Sprintf("[%s] %s", e.Timestamp.Format(time.RFC3339), e.Message)
	}
	resp := map[string]any{
		"templateID": b.name, "buildID": b.id, "status": b.status,
		"logEntries": entries, "logs": logs,
	}
	if b.reason != nil {
		resp["reason"] = b.reason
	}
	writeJSON(w, http.StatusOK, resp)
}

// translate turns E2B's build request into atoll build instructions, and
// says for each which E2B step it comes from ("base", a 1-based step
// number, or "finalize"), as build logs and errors name them.
func (s *Server) translate(ctx context.Context, body startBuildBody) ([]dockerfile.Instruction, []string, error) {
	if body.FromImageRegistry != nil {
		return nil, nil, bad("registry credentials (fromImageRegistry, fromAWSRegistry, fromGCPRegistry) are not supported by atoll")
	}
	tr := translator{}
	from := dockerfile.Instruction{Cmd: "FROM", Flags: map[string]string{}}
	switch {
	case body.FromTemplate != "" && body.FromImage != "":
		return nil, nil, bad("fromImage and fromTemplate are exclusive")
	case body.FromTemplate != "":
		name, tag, err := parseName(body.FromTemplate)
		if err != nil {
			return nil, nil, err
		}
		ref := atollRef(name, tag)
		if t, ok := s.cfg.Aliases[name]; ok {
			if tag != "" {
				return nil, nil, fmt.Errorf("template '%s' not found: %w", truncate(body.FromTemplate), errdefs.ErrNotFound)
			}
			if ref, err = s.aliased(ctx, t); err != nil {
				return nil, nil, err
			}
		} else if _, err := s.cfg.Templates.Get(ctx, atollName(name, tag)); err != nil && !isVersionRef(tag) {
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil, nil, fmt.Errorf("base template '%s' not found: %w", truncate(body.FromTemplate), errdefs.ErrNotFound)
			}
			return nil, nil, err
		}
		from.Args = []string{ref}
		// E2B's templates run their steps as user, in its home, as its
		// base template does.
		tr.user, tr.workdir = "user", "/home/user"
	case body.FromImage == "" || body.FromImage == e2bBaseImage || body.FromImage == e2bBaseImage+":latest":
		// fromBaseImage(), the SDK's default: E2B's base image is what
		// the alias base names (atoll's base template where there is one,
		// else the built-in one). As after any fromImage, steps run as root.
		alias, ok := s.cfg.Aliases["base"]
		if !ok {
			alias = DefaultAliases["base"]
		}
		ref, err := s.aliased(ctx, alias)
		if err != nil {
			return nil, nil, err
		}
		from.Args = []string{ref}
		tr.user = "root"
	default:
		from.Args = []string{body.FromImage}
		from.Flags["image"] = "yes"
		tr.user = "root"
	}
	if body.Force {
		from.Flags["force"] = "yes"
	}
	from.Text = "FROM " + from.Args[0]
	tr.add(from, "base")
	for i, st := range body.Steps {
		if err := tr.step(i+1, st, s.cfg.Templates); err != nil {
			return nil, nil, fmt.Errorf("step %d (%s): %w", i+1, truncate(st.Type), err)
		}
	}
	var labels []string
	if body.StartCmd != "" {
		labels = append(labels, "atoll.start", body.StartCmd)
	}
	if body.ReadyCmd != "" {
		labels = append(labels, "atoll.ready", body.ReadyCmd)
	}
	if labels != nil {
		tr.add(dockerfile.Instruction{Cmd: "LABEL", Args: labels, Text: "start and ready commands"}, "finalize")
	}
	return tr.ins, tr.steps, nil
}

// e2bBaseImage is the image fromBaseImage() names.
const e2bBaseImage = "e2bdev/base"

// translator keeps what E2B's builder keeps between steps: the user steps
// run as, and the working directory.
type translator struct {
	ins     []dockerfile.Instruction
	steps   []string
	user    string
	workdir string
}

func (tr *translator) add(in dockerfile.Instruction, step string) {
	tr.ins = append(tr.ins, in)
	tr.steps = append(tr.steps, step)
}

var userPattern = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// home is where a user's relative paths start when no WORKDIR was set, as
// on E2B.
func home(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// stepTypes are the template step types atoll translates, by E2B's name.
var stepTypes = map[string]func(tr *translator, name string, st templateStep, flags map[string]string, files buildFiles) error{
	"RUN":     (*translator).runStep,
	"COPY":    (*translator).copyStep,
	"ENV":     (*translator).envStep,
	"WORKDIR": (*translator).workdirStep,
	"USER":    (*translator).userStep,
}

// buildFiles says whether the files of a COPY were uploaded.
type buildFiles interface{ HasBuildFiles(string) bool }

// step translates the template's step n (from 1) into Dockerfile
// instructions.
func (tr *translator) step(n int, st templateStep, files buildFiles) error {
	name := strconv.Itoa(n)
	flags := map[string]string{}
	if st.Force {
		flags["force"] = "yes"
	}
	for _, a := range st.Args {
		if strings.ContainsRune(a, 0) {
			return bad("NUL byte in an argument")
		}
	}
	translate, ok := stepTypes[strings.ToUpper(st.Type)]
	if !ok {
		return bad("step type %q is not supported by atoll", truncate(st.Type))
	}
	return translate(tr, name, st, flags, files)
}

// runStep translates RUN: a command as the given user (else the current
// one), in the working directory, else the user's home, as E2B's RUN does.
func (tr *translator) runStep(name string, st templateStep, flags map[string]string, files buildFiles) error {
	if len(st.Args) < 1 || st.Args[0] == "" {
		return bad("RUN needs a command")
	}
	flags["user"] = tr.user
	if len(st.Args) > 1 && st.Args[1] != "" {
		flags["user"] = st.Args[1]
	}
	// As E2B's: in the working directory, else the user's home.
	flags["cwd"] = tr.workdir
	if tr.workdir == "" {
		flags["cwd"] = home(flags["user"])
	}
	tr.add(dockerfile.Instruction{Cmd: "RUN", Args: st.Args[:1], Flags: flags, Text: "RUN " + st.Args[0]}, name)
	return nil
}

// copyStep translates COPY: uploaded files (named by their filesHash) to a
// destination relative to the working directory, else the user's home,
// owned by root, user or numeric IDs.
func (tr *translator) copyStep(name string, st templateStep, flags map[string]string, files buildFiles) error {
	if len(st.Args) < 2 {
		return bad("COPY needs a source and a destination")
	}
	if !validFilesHash(st.FilesHash) {
		return bad("COPY needs the filesHash of its uploaded files")
	}
	if !files.HasBuildFiles(st.FilesHash) {
		return bad("the files of COPY %s were not uploaded: ask GET /templates/{templateID}/files/%s", truncate(st.Args[0]), st.FilesHash)
	}
	src, err := copySource(st.Args[0])
	if err != nil {
		return err
	}
	dest := st.Args[1]
	if !strings.HasPrefix(dest, "/") {
		base := tr.workdir
		if base == "" {
			base = home(tr.user)
		}
		slash := strings.HasSuffix(dest, "/")
		dest = strings.TrimSuffix(base, "/") + "/" + dest
		if slash && !strings.HasSuffix(dest, "/") {
			dest += "/"
		}
	}
	owner := tr.user
	if len(st.Args) > 2 && st.Args[2] != "" {
		owner = st.Args[2]
	}
	if !strings.Contains(owner, ":") {
		owner += ":" + owner
	}
	for _, id := range strings.SplitN(owner, ":", 2) {
		if _, err := strconv.Atoi(id); err != nil && id != "root" && id != "user" {
			return bad("COPY owner %q: atoll takes root, user or numeric IDs", truncate(owner))
		}
	}
	flags["chown"] = owner
	if len(st.Args) > 3 && st.Args[3] != "" {
		flags["chmod"] = st.Args[3]
	}
	flags["files"] = st.FilesHash
	tr.add(dockerfile.Instruction{Cmd: "COPY", Args: []string{src, dest}, Flags: flags, Text: "COPY " + st.Args[0] + " " + st.Args[1]}, name)
	return nil
}

// envStep translates ENV: key, value pairs.
func (tr *translator) envStep(name string, st templateStep, flags map[string]string, files buildFiles) error {
	if len(st.Args) == 0 || len(st.Args)%2 != 0 {
		return bad("ENV needs keys and values")
	}
	for i := 0; i < len(st.Args); i += 2 {
		if st.Args[i] == "" || strings.ContainsAny(st.Args[i], "= ") {
			return bad("ENV key %q", truncate(st.Args[i]))
		}
	}
	tr.add(dockerfile.Instruction{Cmd: "ENV", Args: st.Args, Flags: flags, Text: "ENV " + strings.Join(st.Args, " ")}, name)
	return nil
}

// workdirStep translates WORKDIR: the directory is made, owned by the user
// as on E2B, and becomes the working directory.
func (tr *translator) workdirStep(name string, st templateStep, flags map[string]string, files buildFiles) error {
	if len(st.Args) < 1 || st.Args[0] == "" {
		return bad("WORKDIR needs a path")
	}
	dir := st.Args[0]
	if !strings.HasPrefix(dir, "/") {
		base := tr.workdir
		if base == "" {
			base = "/"
		}
		dir = strings.TrimSuffix(base, "/") + "/" + dir
	}
	// As E2B's: the directories it makes belong to the user.
	mk := dockerfile.Instruction{Cmd: "RUN", Args: []string{workdirScript(dir, tr.user)},
		Flags: map[string]string{"user": "root", "force": flags["force"]}, Text: "RUN mkdir -p " + dir}
	tr.add(mk, name)
	tr.add(dockerfile.Instruction{Cmd: "WORKDIR", Args: []string{dir}, Flags: flags, Text: "WORKDIR " + dir}, name)
	tr.workdir = dir
	return nil
}

// userStep translates USER: the user is made when the image lacks it.
func (tr *translator) userStep(name string, st templateStep, flags map[string]string, files buildFiles) error {
	if len(st.Args) < 1 || !userPattern.MatchString(st.Args[0]) {
		return bad("USER needs a user name of [a-z0-9_-]")
	}
	u := st.Args[0]
	if u != "root" && u != "user" {
		// E2B's USER makes the user when the image lacks it.
		mk := dockerfile.Instruction{Cmd: "RUN", Args: []string{"id -u " + u + " >/dev/null 2>&1 || useradd --create-home --shell /bin/bash " + u},
			Flags: map[string]string{"user": "root", "force": flags["force"]}, Text: "RUN useradd " + u}
		tr.add(mk, name)
	}
	tr.add(dockerfile.Instruction{Cmd: "USER", Args: []string{u}, Flags: flags, Text: "USER " + u}, name)
	tr.user = u
	return nil
}

// copySource is the path a COPY takes its files from in the upload: the SDK
// expands globs itself and uploads only the matching files, so the part of
// the pattern before its first wildcard is the directory they are in.
func copySource(src string) (string, error) {
	if strings.HasPrefix(src, "/") {
		return "", bad("COPY source %q must be relative", truncate(src))
	}
	if i := strings.IndexAny(src, "*?[{"); i >= 0 {
		src = src[:i]
		if j := strings.LastIndexByte(src, '/'); j >= 0 {
			src = src[:j]
		} else {
			src = "."
		}
	}
	src = strings.TrimSuffix(src, "/")
	if src == "" {
		src = "."
	}
	for _, part := range strings.Split(src, "/") {
		if part == ".." {
			return "", bad("COPY source %q leaves the build context", truncate(src))
		}
	}
	return src, nil
}

// workdirScript makes dir and gives the directories it creates to user.
func workdirScript(dir, user string) string {
	return fmt.Sprintf(`t=%s; [ -d "$t" ] && exit 0; f=$t; c=$t; while [ ! -d "$c" ]; do f=$c; c=$(dirname "$c"); done; mkdir -p "$t" && chown -R %s:%s "$f"`,
		shellQuote(dir), user, user)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// tagsBody is the body of E2B's tag requests: assigning names the template
// as target, removing as name (the decoder ignores the other).
type tagsBody struct {
	Target string   `json:"target"`
	Name   string   `json:"name"`
	Tags   []string `json:"tags"`
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	name, tag, tags, ok := s.tagging(w, r, true, func(b tagsBody) string { return b.Target })
	if !ok {
		return
	}
	var version string
	for _, t := range tags {
		if len(atollName(name, t)) > 63 {
			writeError(w, http.StatusBadRequest, "template name and tag are longer than 63 characters together")
			return
		}
		v, err := s.cfg.Templates.Tag(r.Context(), atollRef(name, tag), atollName(name, t))
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		version = v.VersionID
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": tags, "buildID": s.builds.buildIDOf(version)})
}

// tagging reads a tag request, whose template ref names, and answers a
// bad one itself: the name must parse, tags be given and valid
// (normalTags), and with noAlias the name must not be an alias of an atoll
// template (those cannot be tagged).
func (s *Server) tagging(w http.ResponseWriter, r *http.Request, noAlias bool, ref func(tagsBody) string) (name, tag string, tags []string, ok bool) {
	var body tagsBody
	if err := decode(w, r, &body, false); err != nil {
		s.writeErr(w, r, err)
		return "", "", nil, false
	}
	raw := body.Tags
	name, tag, err := parseName(ref(body))
	if err != nil {
		s.writeErr(w, r, err)
		return "", "", nil, false
	}
	if len(raw) == 0 {
		writeError(w, http.StatusBadRequest, "tags are required")
		return "", "", nil, false
	}
	if _, alias := s.cfg.Aliases[name]; noAlias && alias {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is an alias of an atoll template here, which cannot be tagged", name))
		return "", "", nil, false
	}
	if tags, err = normalTags(raw); err != nil {
		s.writeErr(w, r, err)
		return "", "", nil, false
	}
	return name, tag, tags, true
}

// normalTags lower-cases and trims the tags of a tag request and checks
// each (the default tag names the template itself), before any is applied.
func normalTags(raw []string) ([]string, error) {
	tags := make([]string, 0, len(raw))
	for _, t := range raw {
		t = strings.ToLower(strings.TrimSpace(t))
		if t != defaultTag {
			if err := checkTag(t); err != nil {
				return nil, err
			}
		}
		tags = append(tags, t)
	}
	return tags, nil
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	name, _, tags, ok := s.tagging(w, r, false, func(b tagsBody) string { return b.Name })
	if !ok {
		return
	}
	for _, t := range tags {
		// The name itself is the default tag: removing it removes the
		// name, as atoll template rm does.
		if _, err := s.cfg.Templates.Delete(r.Context(), atollName(name, t)); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateTags lists E2B's tags of a template: atoll's names NAME (the
// default tag) and NAME.TAG.
func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, templateID string) {
	name, tag, err := parseName(templateID)
	if err != nil || tag != "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", truncate(templateID)))
		return
	}
	ts, err := s.cfg.Templates.List(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []map[string]any{}
	for _, t := range ts {
		if t.Removed || t.VersionID == "" {
			continue
		}
		tag, ok := strings.CutPrefix(t.Name, name+".")
		if t.Name == name {
			tag, ok = defaultTag, true
		}
		if ok {
			out = append(out, map[string]any{"tag": tag, "buildID": s.builds.buildIDOf(t.VersionID), "createdAt": t.CreatedAt})
		}
	}
	if len(out) == 0 {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", name))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) aliasExists(w http.ResponseWriter, r *http.Request, alias string) {
	name, tag, err := parseName(alias)
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", truncate(alias)))
		return
	}
	if _, ok := s.cfg.Aliases[name]; ok && tag == "" {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": true})
		return
	}
	if _, err := s.cfg.Templates.Get(r.Context(), atollName(name, tag)); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", truncate(alias)))
			return
		}
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
}
