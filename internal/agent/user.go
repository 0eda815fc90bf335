package agent

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// account is a user a process runs as.
type account struct {
	name   string
	uid    int
	gid    int
	groups []int // supplementary, from the group file
	home   string
}

// lookupUser resolves the protocol's user names ("root", the default, and
// "user") in the sandbox's passwd and group files.
func (a *Agent) lookupUser(name string) (account, error) {
	switch name {
	case "", "root":
		acct, err := a.readAccount("root")
		if err != nil {
			// A minimal image may have no passwd entry for root; root is still root.
			return account{name: "root", home: "/root"}, nil
		}
		acct.uid, acct.gid = 0, 0
		return acct, nil
	case "user":
		acct, err := a.readAccount("user")
		if err != nil {
			return account{}, errorf(errdefs.ErrInvalid, "user %q: %v", name, err)
		}
		return acct, nil
	}
	return account{}, errorf(errdefs.ErrInvalid, "unknown user %q: must be \"root\" or \"user\"", name)
}

func (a *Agent) readAccount(name string) (account, error) {
	acct, err := findPasswd(filepath.Join(a.etcDir, "passwd"), name)
	if err != nil {
		return account{}, err
	}
	acct.groups, err = findGroups(filepath.Join(a.etcDir, "group"), name, acct.gid)
	if err != nil {
		return account{}, err
	}
	return acct, nil
}

func findPasswd(file, name string) (account, error) {
	f, err := os.Open(file)
	if err != nil {
		return account{}, fmt.Errorf("reading passwd: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:password:uid:gid:gecos:home:shell
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 || fields[0] != name {
			continue
		}
		uid, err1 := strconv.Atoi(fields[2])
		gid, err2 := strconv.Atoi(fields[3])
		if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			return account{}, fmt.Errorf("malformed passwd entry for %s", name)
		}
		home := fields[5]
		if home == "" {
			home = "/"
		}
		return account{name: name, uid: uid, gid: gid, home: home}, nil
	}
	if err := sc.Err(); err != nil {
		return account{}, fmt.Errorf("reading passwd: %w", err)
	}
	return account{}, fmt.Errorf("no passwd entry")
}

// findGroups returns gid and the gids of the groups listing name as a member.
func findGroups(file, name string, gid int) ([]int, error) {
	groups := []int{gid}
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return groups, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading group: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:password:gid:member,member
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 || !slices.Contains(strings.Split(fields[3], ","), name) {
			continue
		}
		g, err := strconv.Atoi(fields[2])
		if err != nil || g < 0 || slices.Contains(groups, g) {
			continue
		}
		groups = append(groups, g)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading group: %w", err)
	}
	return groups, nil
}
