package vault

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
)

// adverts keep the ref advertisements of the vaults (git http-backend's
// answer to GET info/refs, the first request of every fetch and push),
// to serve them again while the vault's refs are what they were: every
// push and fetch then spares git http-backend and the upload-pack or
// receive-pack it runs, two processes. An advertisement is git's own
// bytes, replayed; it depends on the refs, the service and the protocol
// the client asks for (the Git-Protocol header), which make its key, and
// on the repository's configuration and git's version, which do not
// change under a running server.
//
// A push moves the refs, so the next push's advertisement would always be
// git's to make again. receive-pack's is simple enough to make here
// instead (withRefs): the lines before the refs and the capabilities are
// taken from the one git made last, the refs are the vault's.
type adverts struct {
	mu sync.Mutex
	m  map[string]advert
}

type advert struct {
	refs   string // the refs' digest it was made with
	header http.Header
	body   []byte
}

// maxAdverts bounds the advertisements kept; past it, all are dropped
// (they are made again at the next request of each).
const maxAdverts = 4096

// advertKey is r's advertisement's key for vault id.
func advertKey(r *http.Request, id string) string {
	return id + "\x00" + r.URL.Query().Get("service") + "\x00" + r.Header.Get("Git-Protocol")
}

// refsDigest is a digest of refs.
func refsDigest(refs map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(refs)) {
		h.Write([]byte(k + "\x00" + refs[k] + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// serve writes the advertisement kept for r if the vault's refs are
// still refs, and reports whether it did.
func (a *adverts) serve(w http.ResponseWriter, r *http.Request, id string, refs map[string]string) bool {
	a.mu.Lock()
	ad, ok := a.m[advertKey(r, id)]
	a.mu.Unlock()
	if !ok {
		return false
	}
	body := ad.body
	if ad.refs != refsDigest(refs) {
		if r.URL.Query().Get("service") != "git-receive-pack" {
			return false
		}
		var err error
		if body, err = withRefs(ad.body, refs); err != nil {
			return false
		}
	}
	maps.Copy(w.Header(), ad.header)
	w.WriteHeader(http.StatusOK)
	w.Write(body)
	return true
}

// zeroOID is git's null object ID, which an empty repository's
// advertisement carries its capabilities on.
const zeroOID = "0000000000000000000000000000000000000000"

// withRefs is receive-pack's advertisement body with refs in place of the
// ones it has (gitprotocol-pack(5), "Reference Discovery"): its lines up
// to the first ref (the service line, a flush, a protocol version), then
// the refs sorted by name, the first carrying the capabilities after a
// NUL (an empty repository: a capabilities^{} line of the null ID), then a
// flush. It refuses a body of any other shape, which is then git's to
// make: .have lines, a protocol it does not know.
func withRefs(body []byte, refs map[string]string) ([]byte, error) {
	var out bytes.Buffer
	caps := ""
	for rest := body; ; {
		if len(rest) < 4 {
			return nil, fmt.Errorf("advertisement ends without a flush after its refs")
		}
		var n int
		if _, err := fmt.Sscanf(string(rest[:4]), "%04x", &n); err != nil || (n != 0 && (n < 4 || n > len(rest))) {
			return nil, fmt.Errorf("advertisement: bad pkt-line length %q", rest[:4])
		}
		if n == 0 { // a flush
			if caps != "" {
				break // after the refs: the end
			}
			out.Write(rest[:4])
			rest = rest[4:]
			continue
		}
		line := rest[4:n]
		rest = rest[n:]
		switch {
		case caps == "" && bytes.IndexByte(line, 0) >= 0:
			_, c, _ := bytes.Cut(line, []byte{0})
			caps = string(bytes.TrimSuffix(c, []byte("\n")))
			if caps == "" {
				return nil, fmt.Errorf("advertisement: no capabilities")
			}
		case caps == "" && (bytes.HasPrefix(line, []byte("# service=")) || bytes.HasPrefix(line, []byte("version "))):
			fmt.Fprintf(&out, "%04x%s", len(line)+4, line)
		case caps != "" && isRefLine(line):
		default:
			return nil, fmt.Errorf("advertisement: unexpected line %.40q", line)
		}
	}
	names := slices.Sorted(maps.Keys(refs))
	if len(names) == 0 {
		pkt(&out, zeroOID+" capabilities^{}\x00"+caps+"\n")
	}
	for i, name := range names {
		if i == 0 {
			pkt(&out, refs[name]+" "+name+"\x00"+caps+"\n")
		} else {
			pkt(&out, refs[name]+" "+name+"\n")
		}
	}
	out.WriteString("0000")
	return out.Bytes(), nil
}

// isRefLine reports whether line is an advertised ref without
// capabilities: an object ID, a space, a name under refs/.
func isRefLine(line []byte) bool {
	oid, name, ok := bytes.Cut(bytes.TrimSuffix(line, []byte("\n")), []byte(" "))
	return ok && len(oid) == len(zeroOID) && bytes.HasPrefix(name, []byte("refs/"))
}

// pkt writes s as one pkt-line.
func pkt(b *bytes.Buffer, s string) { fmt.Fprintf(b, "%04x%s", len(s)+4, s) }

// put keeps rec, git's answer to r with the vault's refs at refs, if it
// is one to keep.
func (a *adverts) put(r *http.Request, id string, refs map[string]string, rec *httptest.ResponseRecorder) {
	if rec.Code != http.StatusOK || refs == nil {
		return
	}
	ad := advert{refs: refsDigest(refs), header: rec.Header().Clone(), body: slices.Clone(rec.Body.Bytes())}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil || len(a.m) >= maxAdverts {
		a.m = map[string]advert{}
	}
	a.m[advertKey(r, id)] = ad
}

// drop forgets vault id's advertisements.
func (a *adverts) drop(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.m {
		if len(k) > len(id) && k[:len(id)] == id && k[len(id)] == 0 {
			delete(a.m, k)
		}
	}
}
