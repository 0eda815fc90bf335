package vault

import (
	"crypto/sha256"
	"encoding/hex"
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
	if !ok || ad.refs != refsDigest(refs) {
		return false
	}
	maps.Copy(w.Header(), ad.header)
	w.WriteHeader(http.StatusOK)
	w.Write(ad.body)
	return true
}

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
