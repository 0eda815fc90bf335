// Package tlsca is the server's own certificate authority for HTTPS on
// loopback names: E2B's SDKs address a sandbox's port as
// https://{port}-{id}.{domain}, and for a server on this machine that
// domain is localhost. The CA is made once and kept in the data
// directory; clients trust its certificate (NODE_EXTRA_CA_CERTS, curl
// --cacert). It signs a certificate for each name a client asks for, as it
// is asked: clients refuse wildcards directly under a top-level domain
// (*.localhost), so one certificate cannot serve every sandbox. Its name
// constraints limit it to localhost, its subdomains and loopback
// addresses, so trusting it trusts nothing else.
package tlsca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/atomicfile"
)

// File names in the CA's directory.
const (
	CertFile = "tls-ca.pem"
	keyFile  = "tls-ca-key.pem"
)

// Domain is the domain the CA signs for (and its subdomains).
const Domain = "localhost"

// leafLife is how long a certificate it signs is valid; maxLeaves bounds
// the certificates kept.
const (
	leafLife  = 30 * 24 * time.Hour
	maxLeaves = 4096
)

// CA signs certificates for loopback names.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Load reads the CA kept in dir, making one if there is none.
func Load(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if errors.Is(err, os.ErrNotExist) {
		if err := create(dir); err != nil {
			return nil, fmt.Errorf("making the TLS CA: %w", err)
		}
		certPEM, err = os.ReadFile(filepath.Join(dir, CertFile))
	}
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("TLS CA in %s is malformed", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("TLS CA in %s: %w", dir, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("TLS CA key in %s: %w", dir, err)
	}
	return &CA{cert: cert, key: key, leaves: make(map[string]*tls.Certificate)}, nil
}

// create makes the CA: the key first, then the certificate, each written
// whole under its final name, so that a crash leaves either no CA or a
// complete one (a key alone is made again).
func create(dir string) error {
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:                     pkix.Name{CommonName: "atoll local CA"},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.AddDate(10, 0, 0),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         []string{Domain},
		PermittedIPRanges: []*net.IPNet{
			{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)},
			{IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)},
		},
	}
	der, key, err := Issue(tmpl, nil, nil)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, keyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// Issue makes a P-256 key and the certificate of tmpl for it, with a
// random serial number, signed by parent with parentKey, or by itself if
// parent is nil. It returns the certificate's DER and the key. The
// cluster's CA (internal/cluster/peer) issues through it too.
func Issue(tmpl, parent *x509.Certificate, parentKey crypto.Signer) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	return der, key, err
}

// SetHost makes host, an IP address or a DNS name ("" for none), tmpl's
// subject alternative name.
func SetHost(tmpl *x509.Certificate, host string) {
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if host != "" {
		tmpl.DNSNames = []string{host}
	}
}

// Covers reports whether the CA may sign for name: localhost, a name
// under it, or a loopback address.
func Covers(name string) bool {
	if ip := net.ParseIP(name); ip != nil {
		return ip.IsLoopback()
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	return name == Domain || strings.HasSuffix(name, "."+Domain)
}

// GetCertificate is tls.Config.GetCertificate: a certificate for the name
// the client asks for (localhost when it names none).
func (ca *CA) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	if name == "" {
		name = Domain
	}
	if !Covers(name) {
		return nil, fmt.Errorf("no certificate for %q: this server's CA signs only for %s and its subdomains", name, Domain)
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && time.Until(c.Leaf.NotAfter) > leafLife/2 {
		return c, nil
	}
	c, err := ca.sign(name)
	if err != nil {
		return nil, err
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[name] = c
	return c, nil
}

func (ca *CA) sign(name string) (*tls.Certificate, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafLife),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	SetHost(tmpl, name)
	der, key, err := Issue(tmpl, ca.cert, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// Pool is a certificate pool of the CA alone, for clients.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}
