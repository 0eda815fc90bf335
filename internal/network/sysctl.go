package network

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// writeSysctl sets a sysctl under /proc/sys of the calling thread's network
// namespace; name uses dots ("net.ipv4.ip_forward").
func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s: %w", name, err)
	}
	return nil
}

func readSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/")))
	return strings.TrimSpace(string(b)), err
}
