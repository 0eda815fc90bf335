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

// lookupUser resolves a user for a process: "root", "user", any name in the
// sandbox's passwd file, or "uid[:gid]" / "name:group" as an image's USER
// says. Empty means the sandbox's default (its image's USER), else root.
func (a *Agent) lookupUser(name string) (account, error) {
	if name == "" {
		name = a.cfg.DefaultUser
	}
	switch name {
	case "", "root", "0", "0:0":
		acct, err := a.readAccount("root")
		if err != nil {
			// A minimal image may have no passwd entry for root; root is still root.
			return account{name: "root", home: "/root"}, nil
		}
		acct.uid, acct.gid = 0, 0
		return acct, nil
	}
	if strings.ContainsAny(name, "\x00\n") || len(name) > 256 {
		return account{}, errorf(errdefs.ErrInvalid, "malformed user name")
	}
	userPart, groupPart, hasGroup := strings.Cut(name, ":")
	var acct account
	if uid, err := strconv.Atoi(userPart); err == nil && uid >= 0 {
		acct = account{name: userPart, uid: uid, gid: uid, home: "/"}
		if found, err := a.findUID(uid); err == nil {
			acct = found
		}
	} else {
		found, err := a.readAccount(userPart)
		if err != nil {
			return account{}, errorf(errdefs.ErrInvalid, "user %q: %v", userPart, err)
		}
		acct = found
	}
	if hasGroup {
		gid, err := strconv.Atoi(groupPart)
		if err != nil || gid < 0 {
			if gid, err = findGroupID(filepath.Join(a.etcDir, "group"), groupPart); err != nil {
				return account{}, errorf(errdefs.ErrInvalid, "group %q: %v", groupPart, err)
			}
		}
		acct.gid = gid
	}
	return acct, nil
}

// findUID finds the passwd entry with uid.
func (a *Agent) findUID(uid int) (account, error) {
	b, err := os.ReadFile(filepath.Join(a.etcDir, "passwd"))
	if err != nil {
		return account{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 6 && f[2] == strconv.Itoa(uid) {
			return a.readAccount(f[0])
		}
	}
	return account{}, fmt.Errorf("no passwd entry for uid %d", uid)
}

// findGroupID looks a group name up in the group file.
func findGroupID(file, name string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[0] == name {
			return strconv.Atoi(f[2])
		}
	}
	return 0, fmt.Errorf("no such group")
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
