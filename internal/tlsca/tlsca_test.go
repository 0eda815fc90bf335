package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

func TestCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, keyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	// A server restarted keeps its CA: clients trust it once.
	again, err := Load(dir)
	if err != nil || !again.cert.Equal(ca.cert) {
		t.Fatalf("reloaded CA differs: %v", err)
	}
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"8000-abcdefghij0123456789.localhost", true},
		{"localhost", true},
		{"", true}, // no SNI: localhost
		{"a.b.localhost.", true},
		{"127.0.0.1", true},
		{"::1", true},
		{"example.com", false},
		{"localhost.example.com", false},
		{"evil-localhost", false},
		{"10.0.0.1", false},
	} {
		cert, err := ca.GetCertificate(&tls.ClientHelloInfo{ServerName: c.name})
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if err != nil {
			continue
		}
		name := c.name
		if name == "" {
			name = "localhost"
		}
		opts := x509.VerifyOptions{Roots: again.Pool(), DNSName: name}
		if _, err := cert.Leaf.Verify(opts); err != nil {
			t.Errorf("%q: the certificate does not verify: %v", c.name, err)
		}
	}
	// The CA's name constraints hold even for a certificate it was made
	// to sign for another name.
	bad, err := ca.sign("example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "example.com"}); err == nil {
		t.Error("a certificate for example.com verifies under the CA")
	}
}
