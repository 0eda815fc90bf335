// Checks, with the official e2b SDK, that E2B's default template on atoll
// has what code written for E2B's "base" expects: python (not only
// python3), sudo without a password for user, node and npm, curl and git,
// commands as user in /home/user. cmd/atoll/base_e2e_test.go runs it once
// `atoll template bootstrap base` has made the template; E2B_TEST_TEMPLATE
// is the atoll template that "base" should mean.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

let sbx
after(async () => { await sbx?.kill().catch(() => {}) })

test('the default template is atoll\'s base template', async () => {
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
  const info = await sbx.getInfo()
  assert.equal(info.name, 'base')
  assert.equal(info.templateId, process.env.E2B_TEST_TEMPLATE)
})

// Each command, as E2B's default user, and what its output must match.
const checks = [
  ['whoami', /^user\n$/],
  ['pwd', /^\/home\/user\n$/],
  ['echo $HOME', /^\/home\/user\n$/],
  ['python --version', /^Python 3\.\d+\.\d+\n$/],
  ['python -c "import sys; print(sys.executable)"', /^\/usr\/bin\/python\d*\.?\d*\n$/],
  ['python3 -m pip --version', /^pip \d+/],
  ['sudo -n true && echo ok', /^ok\n$/],
  ['sudo whoami', /^root\n$/],
  ['sudo -n apt-get --version | head -1', /^apt \d/],
  ['node --version', /^v\d+\.\d+\.\d+\n$/],
  ['node -e "console.log(6*7)"', /^42\n$/],
  ['npm --version', /^\d+\.\d+\.\d+\n$/],
  ['curl --version | head -1', /^curl \d/],
  ['git --version', /^git version \d/],
  ['id -u; id -Gn', /^1000\nuser sudo\n$/],
  ['getent passwd user | cut -d: -f6,7', /^\/home\/user:\/bin\/bash\n$/],
  ['test -f ~/.bashrc && echo skel', /^skel\n$/],
]
for (const [cmd, want] of checks) {
  test(`commands.run: ${cmd}`, async () => {
    const r = await sbx.commands.run(cmd)
    assert.equal(r.exitCode, 0, r.stderr)
    assert.match(r.stdout, want)
  })
}

// E2B's envVars test: a command's envs stay its own; sudo works as user.
test('sudo, and a command\'s scoped envs', async () => {
  const r = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })
  assert.equal(r.stdout.trim(), 'bar')
  const r2 = await sbx.commands.run('sudo echo "$FOO"')
  assert.equal(r2.exitCode, 0)
  assert.equal(r2.stdout.trim(), '')
  // sudo resets the environment.
  assert.equal((await sbx.commands.run('sudo sh -c \'echo "[$FOO]"\'', { envs: { FOO: 'bar' } })).stdout, '[]\n')
})

test('python -m http.server as user, as E2B\'s host test runs it', async () => {
  const h = await sbx.commands.run('python -m http.server 8000', { background: true })
  try {
    let r
    for (let i = 0; i < 50; i++) {
      r = await sbx.commands.run('curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8000/').catch((e) => e)
      if (r.stdout === '200') break
      await new Promise((res) => setTimeout(res, 100))
    }
    assert.equal(r.stdout, '200')
  } finally {
    await h.kill()
  }
})

test('files: written as user in the home directory', async () => {
  const info = await sbx.files.write('hello.py', 'print("hi from", __import__("os").getcwd())\n')
  assert.equal(info.path, '/home/user/hello.py')
  assert.equal((await sbx.commands.run('python hello.py')).stdout, 'hi from /home/user\n')
  assert.equal((await sbx.commands.run('stat -c %U hello.py')).stdout, 'user\n')
})
