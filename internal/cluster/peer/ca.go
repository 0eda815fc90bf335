package peer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/internal/tlsca"
)

// SecretCA is the name under which the cluster CA is kept in the store's
// shared secrets (store.Cluster.Secret).
const SecretCA = "cluster-ca"

// caLife is how long the cluster CA is valid. Nodes' own certificates are
// short-lived (LeafLife) and renewed; the CA is not, so it outlives any
// cluster we can foresee.
const caLife = 20 * 365 * 24 * time.Hour

// CA is the cluster's certificate authority: the one every node's
// certificate is signed by and the only one a node trusts on its
// node-to-node listener, or when it calls another node.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

// NewCA makes a CA and returns it as PEM: its certificate, then its key.
// It is the make of Secret(ctx, SecretCA, NewCA): the first node to ask
// makes it, and every node gets that one.
func NewCA() ([]byte, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "atoll cluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLife),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, key, err := tlsca.Issue(tmpl, nil, nil)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	pem.Encode(&b, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	return b.Bytes(), nil
}

// ParseCA reads a CA from NewCA's PEM.
func ParseCA(b []byte) (*CA, error) {
	var ca CA
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		var err error
		switch blk.Type {
		case "CERTIFICATE":
			ca.cert, err = x509.ParseCertificate(blk.Bytes)
		case "EC PRIVATE KEY":
			ca.key, err = x509.ParseECPrivateKey(blk.Bytes)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the cluster CA: %w", err)
		}
	}
	if ca.cert == nil || ca.key == nil {
		return nil, errors.New("reading the cluster CA: want a certificate and an EC private key in PEM")
	}
	if !ca.cert.IsCA {
		return nil, errors.New("reading the cluster CA: the certificate is not a CA's")
	}
	pub, ok := ca.cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&ca.key.PublicKey) {
		return nil, errors.New("reading the cluster CA: the key is not the certificate's")
	}
	ca.pool = x509.NewCertPool()
	ca.pool.AddCert(ca.cert)
	return &ca, nil
}

// LoadCA returns the cluster's CA, kept by secret (store.Cluster.Secret)
// under SecretCA: made by the first node that asks, the same for all.
func LoadCA(ctx context.Context, secret func(ctx context.Context, name string, make func() ([]byte, error)) ([]byte, error)) (*CA, error) {
	b, err := secret(ctx, SecretCA, NewCA)
	if err != nil {
		return nil, fmt.Errorf("getting the cluster CA: %w", err)
	}
	return ParseCA(b)
}

// Pool is a pool of the CA alone.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// sign issues a certificate for node name at address (host:port, or a
// host): its common name is the node's name, by which peers know it, and
// its subject alternative name the address's host, by which TLS clients
// check they reached the node they dialled. It serves both ends of a
// connection, so it is valid for server and client authentication.
func (ca *CA) sign(name, address string, life time.Duration, now time.Time) (*tls.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{"atoll node"}},
		// A little slack for clocks that differ between nodes.
		NotBefore:   now.Add(-5 * time.Minute),
		NotAfter:    now.Add(life),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	host := address
	if h, _, err := net.SplitHostPort(address); err == nil {
		host = h
	}
	tlsca.SetHost(tmpl, host)
	der, key, err := tlsca.Issue(tmpl, ca.cert, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing node %s's certificate: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// LeafLife is how long a node's certificate is valid by default. A node
// renews its certificate when a third of that is left, so a certificate
// that leaks (say, with a node's disk) is good for a day at most.
const LeafLife = 24 * time.Hour

// Identity is one node's certificate and the TLS configurations built on
// it. It renews the certificate, as it is used, before it expires.
type Identity struct {
	ca            *CA
	name, address string
	life          time.Duration
	now           func() time.Time

	mu   sync.Mutex
	cert *tls.Certificate
}

// NewIdentity issues node name, whose node-to-node listener is at address,
// its certificate. life is the certificate's validity, LeafLife when 0.
func (ca *CA) NewIdentity(name, address string, life time.Duration) (*Identity, error) {
	if name == "" {
		return nil, errors.New("a node's identity needs its name")
	}
	if life <= 0 {
		life = LeafLife
	}
	id := &Identity{ca: ca, name: name, address: address, life: life, now: time.Now}
	if _, err := id.Certificate(); err != nil {
		return nil, err
	}
	return id, nil
}

// Name is the node's name.
func (id *Identity) Name() string { return id.name }

// Certificate returns the node's current certificate, issuing a new one
// when less than a third of its life is left.
func (id *Identity) Certificate() (*tls.Certificate, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	now := id.now()
	if id.cert != nil && id.cert.Leaf.NotAfter.Sub(now) > id.life/3 {
		return id.cert, nil
	}
	c, err := id.ca.sign(id.name, id.address, id.life, now)
	if err != nil {
		if id.cert != nil && now.Before(id.cert.Leaf.NotAfter) {
			return id.cert, nil // still valid: renew on the next use
		}
		return nil, err
	}
	id.cert = c
	return c, nil
}

// ServerTLS is the TLS configuration of the node's node-to-node listener:
// it presents the node's certificate and accepts only clients presenting
// one the cluster CA signed. Which node a client is, and whether it is a
// live member, is Guard's to check.
func (id *Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return id.Certificate()
		},
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  id.ca.pool,
		// HTTP/1.1 only: upgraded connections (websockets, PTYs) pass
		// through the router, and HTTP/2 has no upgrade.
		NextProtos: []string{"http/1.1"},
	}
}

// ClientTLS is the TLS configuration for calling node name at address: it
// presents this node's certificate, trusts only the cluster CA, and
// accepts only a server whose certificate names that node, for that
// address.
func (id *Identity) ClientTLS(name, address string) *tls.Config {
	host := address
	if h, _, err := net.SplitHostPort(address); err == nil {
		host = h
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    id.ca.pool,
		ServerName: host,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.Certificate()
		},
		// The chain and the address were verified; the name is ours to
		// check: any node's certificate is the cluster CA's, and an
		// address can pass from one node to another.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the peer presented no certificate")
			}
			if got := cs.PeerCertificates[0].Subject.CommonName; got != name {
				return fmt.Errorf("reached node %q at %s, not node %q", got, address, name)
			}
			return nil
		},
		NextProtos: []string{"http/1.1"},
	}
}
