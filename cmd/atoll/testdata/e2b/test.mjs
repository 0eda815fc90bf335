// Runs the official e2b SDK against atoll the way agent code uses it.
// cmd/atoll/e2b_test.go starts `atoll serve` and runs this with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at it, E2B_DOMAIN
// set to localhost:PORT (so that getHost() names atoll's listener), a second
// tenant's key in E2B_TEST_OTHER_KEY and, in E2B_TEST_INTERNET_URL, an HTTP
// server outside that sandboxes may or may not reach; by hand:
//   E2B_API_URL=http://127.0.0.1:7400 E2B_SANDBOX_URL=http://127.0.0.1:7400 \
//   E2B_DOMAIN=localhost:7400 E2B_API_KEY=$(sudo cat /var/lib/atoll/api-key) \
//   E2B_TEST_OTHER_KEY=$(sudo atoll key create --name other) node test.mjs
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import https from 'node:https'
import {
  Sandbox, CommandExitError, FileNotFoundError, SandboxNotFoundError,
  AuthenticationError, NotFoundError, TimeoutError, FilesystemEventType, ALL_TRAFFIC,
} from 'e2b'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const run = Date.now().toString(36) // tells this run's sandboxes apart
const created = []
async function create(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts, metadata: { run, ...opts.metadata } })
  created.push(sbx)
  return sbx
}
after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})

// waitFor polls f until it returns something truthy.
async function waitFor(f, what, ms = 10_000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${typeof what === "function" ? what() : what}`)
    await sleep(50)
  }
}

let sbx
test('create: template base, metadata, envs, info', async () => {
  sbx = await create({ metadata: { role: 'main' }, envs: { FROM_CREATE: 'yes' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
  assert.equal(await sbx.isRunning(), true)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.name, 'base')
  assert.deepEqual(info.metadata, { run, role: 'main' })
  assert.ok(info.endAt > info.startedAt)
  assert.ok(info.cpuCount >= 1 && info.memoryMB > 0)
})

test('commands.run: stdout, stderr, exit codes, env, cwd, user', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2; echo $FROM_CREATE $MINE; pwd; whoami', { envs: { MINE: 'mine' } })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\nyes mine\n/home/user\nuser\n')
  assert.equal(r.stderr, 'err\n')

  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 7'), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 7)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'bad\n')
    assert.equal(e.error, 'exit status 7')
    return true
  })
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  await assert.rejects(sbx.commands.run('true', { cwd: '/no/such/dir' }))
  const outs = []
  await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => outs.push(d) })
  assert.equal(outs.join(''), 'line1\nline2\nline3\n')
  // python3 and git, which E2B's base template has, come from the host here.
  assert.equal((await sbx.commands.run('python3 -c "print(6*7)"')).stdout, '42\n')
  assert.match((await sbx.commands.run('git --version')).stdout, /^git version/)
})

test('commands: stdin', async () => {
  const h = await sbx.commands.run('read a; read b; echo "$a+$b"; cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'one\n')
  await h.sendStdin('two\nrest')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout, 'one+two\nrest')
  // Without stdin: true the command reads end of file at once.
  assert.equal((await sbx.commands.run('cat; echo done')).stdout, 'done\n')
})

test('commands: background, list, connect, kill', async () => {
  const h = await sbx.commands.run('echo started; sleep 600', { background: true, timeoutMs: 0 })
  await waitFor(() => h.stdout.includes('started'), 'background output')
  const procs = await sbx.commands.list()
  const p = procs.find((p) => p.pid === h.pid)
  assert.ok(p, `pid ${h.pid} not listed in ${JSON.stringify(procs)}`)
  assert.equal(p.cmd, '/bin/bash')

  await h.disconnect()
  const again = await sbx.commands.connect(h.pid)
  assert.equal(again.pid, h.pid)
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(again.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1)
  assert.equal(await sbx.commands.kill(h.pid), false)
  await assert.rejects(sbx.commands.connect(h.pid), NotFoundError)

  // The handle's own kill, and a command's timeout.
  const h2 = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await h2.kill(), true)
  await assert.rejects(sbx.commands.run('sleep 600', { timeoutMs: 500 }))
})

test('files: write, read, list, exists, getInfo', async () => {
  const info = await sbx.files.write('/home/user/dir/hello.txt', 'hello world')
  assert.equal(info.path, '/home/user/dir/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(await sbx.files.read('/home/user/dir/hello.txt'), 'hello world')
  assert.equal(await sbx.files.read('dir/hello.txt'), 'hello world', 'relative to home')
  const bytes = await sbx.files.read('/home/user/dir/hello.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello world')
  await sbx.files.write('/home/user/empty', '')
  assert.equal(await sbx.files.read('/home/user/empty'), '')

  const many = await sbx.files.write([
    { path: '/home/user/dir/a.txt', data: 'A' },
    { path: '/home/user/dir/sub/b.bin', data: new Uint8Array([0, 1, 2, 255]) },
  ])
  assert.equal(many.length, 2)
  assert.deepEqual([...await sbx.files.read('/home/user/dir/sub/b.bin', { format: 'bytes' })], [0, 1, 2, 255])
  // Files written as the default user are the user's, so its commands can change them.
  assert.equal((await sbx.commands.run('echo more >> /home/user/dir/a.txt && stat -c %U /home/user/dir/sub')).stdout, 'user\n')

  const names = (await sbx.files.list('/home/user/dir')).map((e) => `${e.name}:${e.type}`).sort()
  assert.deepEqual(names, ['a.txt:file', 'hello.txt:file', 'sub:dir'])
  const deep = (await sbx.files.list('/home/user/dir', { depth: 2 })).map((e) => e.path).sort()
  assert.ok(deep.includes('/home/user/dir/sub/b.bin'), deep.join(' '))

  assert.equal(await sbx.files.exists('/home/user/dir/hello.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope'), false)
  const st = await sbx.files.getInfo('/home/user/dir/hello.txt')
  assert.equal(st.type, 'file')
  assert.equal(st.size, 11)
  assert.equal(st.owner, 'user')
  assert.equal(st.permissions, '-rw-r--r--')
  assert.ok(st.modifiedTime instanceof Date)
  const dinfo = await sbx.files.getInfo('/home/user/dir')
  assert.equal(dinfo.type, 'dir')
  // envd on ext4: a directory has at least a block's size; an empty one too.
  assert.ok(dinfo.size >= 4096, `dir size ${dinfo.size}`)
  await sbx.files.makeDir('/home/user/emptydir')
  assert.ok((await sbx.files.getInfo('/home/user/emptydir')).size >= 4096)
  await assert.rejects(sbx.files.read('/home/user/nope.txt'), FileNotFoundError)
  await assert.rejects(sbx.files.getInfo('/home/user/nope.txt'), FileNotFoundError)
})

test('files: metadata', async () => {
  // Kept as the file's user.e2b.* extended attributes, keys lower-cased as
  // by E2B's envd; the SDK drops an empty set to undefined.
  const meta = { owner: 'agent-7', run: '42', empty: '' }
  const w = await sbx.files.write('/home/user/meta/a.txt', 'a', { metadata: { Owner: 'agent-7', run: '42', empty: '' } })
  assert.deepEqual(w.metadata, meta)
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta/a.txt')).metadata, meta)
  const getxattr = `python3 -c "import os; print(os.getxattr('/home/user/meta/a.txt', 'user.e2b.owner').decode(), end='')"`
  assert.equal((await sbx.commands.run(getxattr)).stdout, 'agent-7')
  // Set inside the sandbox by its own processes: shown too.
  await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/meta/a.txt', 'user.e2b.tool', b'py')"`)
  await sbx.files.write('/home/user/meta/plain.txt', 'p')
  const listed = Object.fromEntries((await sbx.files.list('/home/user/meta')).map((e) => [e.name, e.metadata]))
  assert.deepEqual(listed, { 'a.txt': { ...meta, tool: 'py' }, 'plain.txt': undefined })
  // Several files at once: the same set on each.
  const many = await sbx.files.write([{ path: '/home/user/meta/m1', data: '1' }, { path: '/home/user/meta/m2', data: '2' }], { metadata: { batch: 'b' } })
  assert.deepEqual(many.map((f) => f.metadata), [{ batch: 'b' }, { batch: 'b' }])
  // Streams and gzip take the raw upload: metadata goes there too.
  const gz = await sbx.files.write('/home/user/meta/gz.txt', 'zipped', { gzip: true, metadata: { z: '1' } })
  assert.deepEqual(gz.metadata, { z: '1' })
  // A rename keeps it.
  const moved = await sbx.files.rename('/home/user/meta/a.txt', '/home/user/meta/moved/b.txt')
  assert.deepEqual(moved.metadata, { ...meta, tool: 'py' })
  // An overwrite without metadata clears it; with other metadata, only that stays.
  assert.equal((await sbx.files.write('/home/user/meta/moved/b.txt', 'again')).metadata, undefined)
  assert.equal((await sbx.files.getInfo('/home/user/meta/moved/b.txt')).metadata, undefined)
  await sbx.files.write('/home/user/meta/m1', 'x', { metadata: { other: 'o' } })
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta/m1')).metadata, { other: 'o' })
  // Hostile metadata: the SDK refuses what no header carries; atoll refuses
  // the rest with a 400, which the SDK reports, and writes nothing.
  for (const bad of [{ ['k'.repeat(300)]: 'v' }, { k: 'v'.repeat(5000) }, Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`key${i}`, 'v']))]) {
    await assert.rejects(sbx.files.write('/home/user/meta/bad.txt', 'x', { metadata: bad }), /metadata/)
  }
  await assert.rejects(sbx.files.write('/home/user/meta/bad.txt', 'x', { metadata: { 'a b': 'v' } }), /metadata key/)
  await assert.rejects(sbx.files.write('/home/user/meta/bad.txt', 'x', { metadata: { k: 'nul\u0000' } }), /metadata value/)
  assert.equal(await sbx.files.exists('/home/user/meta/bad.txt'), false)
})

test('files: signed upload and download URLs', async () => {
  await sbx.files.write('/home/user/signed.txt', 'signed')
  const down = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
  // With E2B_SANDBOX_URL the URLs name no sandbox; the signature does.
  assert.ok(down.startsWith(process.env.E2B_SANDBOX_URL), down)
  const res = await fetch(down)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'signed')
  const forged = new URL(down)
  forged.searchParams.set('path', '/etc/shadow')
  assert.notEqual((await fetch(forged)).status, 200)
  // With a sandbox's routing headers, as through a proxy, it is envd's 401.
  const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }
  assert.equal((await fetch(forged, { headers })).status, 401)
  assert.equal((await fetch(down, { headers })).status, 200)
  const up = await sbx.uploadUrl('/home/user/uploaded.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'uploaded.txt')
  assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200)
  assert.equal(await sbx.files.read('/home/user/uploaded.txt'), 'uploaded')
})

test('files: gzip and streams', async () => {
  await sbx.files.write('/home/user/gz.txt', 'zipped', { gzip: true })
  assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), 'zipped')
  const enc = new TextEncoder()
  const body = new ReadableStream({ start(c) { c.enqueue(enc.encode('stre')); c.enqueue(enc.encode('amed')); c.close() } })
  await sbx.files.write('/home/user/stream.txt', body)
  let text = ''
  for await (const chunk of await sbx.files.read('/home/user/stream.txt', { format: 'stream' })) text += new TextDecoder().decode(chunk)
  assert.equal(text, 'streamed')
})

test('files: makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/home/user/made/deep'), true)
  assert.equal(await sbx.files.makeDir('/home/user/made/deep'), false)
  assert.equal((await sbx.files.getInfo('/home/user/made')).owner, 'user')
  await sbx.files.write('/home/user/made/f.txt', 'f')
  const moved = await sbx.files.rename('/home/user/made/f.txt', '/home/user/moved/to/g.txt')
  assert.equal(moved.path, '/home/user/moved/to/g.txt')
  assert.equal(await sbx.files.read('/home/user/moved/to/g.txt'), 'f')
  assert.equal(await sbx.files.exists('/home/user/made/f.txt'), false)
  await assert.rejects(sbx.files.rename('/home/user/none', '/home/user/x'), FileNotFoundError)
  await sbx.files.remove('/home/user/made')
  assert.equal(await sbx.files.exists('/home/user/made'), false)
  await sbx.files.remove('/home/user/made') // already gone: no error, as in E2B
})

test('files: watchDir', async () => {
  await sbx.files.makeDir('/home/user/watched')
  const events = []
  const w = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/home/user/watched/new.txt', 'x')
  await sbx.commands.run('mkdir -p /home/user/watched/sub && echo y > /home/user/watched/sub/inner.txt')
  await waitFor(() => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.CREATE), 'create event')
  await waitFor(() => events.some((e) => e.name === 'sub/inner.txt'), `recursive event in ${JSON.stringify(events)}`)
  await w.stop()
  await assert.rejects(sbx.files.watchDir('/home/user/not-there', () => {}), FileNotFoundError)
})

test('files: watchDir with includeEntry and allowNetworkMounts', async () => {
  await sbx.files.makeDir('/home/user/we')
  const events = []
  const w = await sbx.files.watchDir('/home/user/we', (e) => events.push(e), { includeEntry: true, allowNetworkMounts: true })
  await sbx.files.write('/home/user/we/e.txt', 'entry', { metadata: { k: 'v' } })
  // The entry is read when the event is sent, as envd does: a file removed
  // before then has none, so the remove waits for the write's event.
  await waitFor(() => events.some((e) => e.type === FilesystemEventType.WRITE && e.entry), () => `write with its entry in ${JSON.stringify(events)}`)
  await sbx.files.remove('/home/user/we/e.txt')
  await waitFor(() => events.some((e) => e.type === FilesystemEventType.REMOVE), () => `remove in ${JSON.stringify(events)}`)
  await w.stop()
  const write = events.find((e) => e.type === FilesystemEventType.WRITE && e.entry)
  assert.ok(write, JSON.stringify(events))
  assert.equal(write.entry.path, '/home/user/we/e.txt')
  assert.equal(write.entry.type, 'file')
  assert.equal(write.entry.size, 5)
  assert.equal(write.entry.owner, 'user')
  assert.deepEqual(write.entry.metadata, { k: 'v' })
  assert.ok(write.entry.modifiedTime instanceof Date)
  assert.equal(events.find((e) => e.type === FilesystemEventType.REMOVE).entry, undefined, 'a removed file has no entry')
  // Without includeEntry, events carry none.
  const plain = []
  const w2 = await sbx.files.watchDir('/home/user/we', (e) => plain.push(e))
  await sbx.files.write('/home/user/we/p.txt', 'p')
  await waitFor(() => plain.some((e) => e.type === FilesystemEventType.WRITE), 'plain write event')
  await w2.stop()
  assert.ok(plain.every((e) => e.entry === undefined), JSON.stringify(plain))
})

test('files: a watcher sees files.write as a write', async () => {
  // atoll writes atomically (a temporary file renamed over the target);
  // watchers still see what E2B's envd's write in place makes.
  await sbx.files.write('/home/user/ww/sub/old.txt', 'old')
  const events = []
  const w = await sbx.files.watchDir('/home/user/ww', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/home/user/ww/sub/old.txt', 'new')
  await sbx.files.write('/home/user/ww/fresh.txt', 'fresh')
  const seen = (name, type) => events.some((e) => e.name === name && e.type === type)
  await waitFor(() => seen('sub/old.txt', FilesystemEventType.WRITE) && seen('fresh.txt', FilesystemEventType.WRITE),
    () => `write events in ${JSON.stringify(events)}`)
  await w.stop()
  assert.ok(seen('fresh.txt', FilesystemEventType.CREATE))
  assert.ok(!seen('sub/old.txt', FilesystemEventType.CREATE), 'an overwrite creates nothing')
  assert.ok(!events.some((e) => e.name.includes('.atoll-write-')), JSON.stringify(events))
  assert.equal(await sbx.files.read('/home/user/ww/sub/old.txt'), 'new')
})

test('files: list with depth walks depth first, in lexical order', async () => {
  for (const p of ['b/y.txt', 'b/a/z.txt', 'a.txt', 'c/d/e/f.txt']) await sbx.files.write(`/home/user/tree/${p}`, p)
  const got = (await sbx.files.list('/home/user/tree', { depth: 3 })).map((e) => e.path.replace('/home/user/tree/', ''))
  assert.deepEqual(got, ['a.txt', 'b', 'b/a', 'b/a/z.txt', 'b/y.txt', 'c', 'c/d', 'c/d/e'])
})

test('commands: a sandbox killed under a running command', async () => {
  const k = await create()
  // As on E2B: the connection drops, envd's health says the sandbox is
  // gone, and the SDK says so (an RPC error would read as a timeout).
  const ended = assert.rejects(k.commands.run('sleep 60'), (e) => {
    assert.ok(e instanceof TimeoutError, String(e))
    assert.match(e.message, /killed or reached its end of life/)
    return true
  })
  await sleep(500)
  assert.equal(await Sandbox.kill(k.sandboxId), true)
  await ended
})

test('files: a watch whose sandbox is killed ends as on E2B', async () => {
  const k = await create()
  let exited
  const ended = new Promise((resolve) => { exited = resolve })
  await k.files.watchDir('/home/user', () => {}, { onExit: (err) => exited(err) })
  assert.equal(await Sandbox.kill(k.sandboxId), true)
  const err = await ended
  assert.ok(err instanceof TimeoutError, String(err))
  assert.match(err.message, /killed or reached its end of life/)
})

test('pty: create, input, resize, kill', async () => {
  let out = ''
  const td = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += td.decode(d, { stream: true }) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo pty-$((40+2))\n'))
  await waitFor(() => out.includes('pty-42'), `pty output, got ${JSON.stringify(out)}`)
  assert.ok(out.includes('24 80'), out)
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
  await waitFor(() => out.includes('30 100'), 'resized')
  await term.disconnect()
  let out2 = ''
  const again = await sbx.pty.connect(term.pid, { onData: (d) => { out2 += td.decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo again\n'))
  await waitFor(() => out2.includes('again'), 'output after reconnecting')
  assert.equal(await sbx.pty.kill(term.pid), true)
  await assert.rejects(again.wait())
  await assert.rejects(term.wait())
})

test('setTimeout', async () => {
  const before = (await sbx.getInfo()).endAt
  await sbx.setTimeout(3_600_000)
  const after = (await sbx.getInfo()).endAt
  assert.ok(after - before > 3_000_000, `endAt ${before} -> ${after}`)
})

test('getMetrics: a busy sandbox, time ranges, another tenant', async () => {
  const m = await create({ metadata: { role: 'metrics' } })
  const start = new Date()
  // Holds 128 MiB and spins until it has had 12 s of CPU (longer by the
  // clock on a loaded host).
  await m.commands.run(`python3 -c "import time; b = b'x' * (128 << 20); t = time.process_time(); exec('while time.process_time() - t < 12: pass'); time.sleep(600)"`,
    { background: true, timeoutMs: 0 })
  // Samples come every 5 s, as on E2B, whose own tests give the first 30 s.
  const busy = await waitFor(async () => (await m.getMetrics()).find((x) => x.cpuUsedPct > 10 && x.memUsed > 100 * 2 ** 20),
    'a sample with the CPU and memory in use', 60_000)
  assert.ok(busy.timestamp instanceof Date && !isNaN(busy.timestamp), `timestamp ${busy.timestamp}`)
  const info = await m.getInfo()
  assert.equal(busy.cpuCount, info.cpuCount)
  assert.equal(busy.memTotal, info.memoryMB * 2 ** 20)
  assert.ok(busy.cpuUsedPct <= 100 && busy.memUsed <= busy.memTotal, JSON.stringify(busy))
  assert.ok(busy.diskTotal > 0 && busy.diskUsed >= 0 && busy.diskUsed <= busy.diskTotal && busy.memCache >= 0, JSON.stringify(busy))

  // A range from the test's start has the busy sample; the SDK sends
  // whole seconds, so allow one either side.
  const end = new Date()
  const ranged = await m.getMetrics({ start, end })
  assert.ok(ranged.some((x) => x.timestamp.getTime() === busy.timestamp.getTime()), 'the busy sample is in the range')
  for (const x of ranged) {
    assert.ok(x.timestamp >= start - 1000 && x.timestamp <= end.getTime() + 1000, `${x.timestamp} outside ${start}..${end}`)
  }
  assert.deepEqual(await m.getMetrics({ start: new Date(start - 3_600_000), end: new Date(start - 1_800_000) }), [])
  assert.ok((await Sandbox.getMetrics(m.sandboxId)).length >= ranged.length)
  await assert.rejects(m.getMetrics({ start: end, end: start }), (e) => /400|start is after end/i.test(e.message))

  const other = { apiKey: process.env.E2B_TEST_OTHER_KEY }
  await assert.rejects(Sandbox.getMetrics(m.sandboxId, other), SandboxNotFoundError)
  await m.kill()
  await assert.rejects(Sandbox.getMetrics(m.sandboxId), SandboxNotFoundError)
})

test('pause, list paused, connect, resume', async () => {
  const p = await create({ metadata: { role: 'pausing' } })
  await p.files.write('/home/user/state.txt', 'kept', { metadata: { kept: 'yes' } })
  const bg = await p.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  assert.equal(await p.pause(), true)
  assert.equal(await p.pause(), false, 'already paused')
  assert.equal(await p.isRunning(), false)
  assert.equal((await p.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run } } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [p.sandboxId])

  const back = await Sandbox.connect(p.sandboxId, { timeoutMs: 120_000 })
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/home/user/state.txt'), 'kept')
  assert.deepEqual((await back.files.getInfo('/home/user/state.txt')).metadata, { kept: 'yes' })
  assert.ok((await back.commands.list()).some((x) => x.pid === bg.pid), 'process survived the pause')
  // Connecting to a running sandbox is fine too, and so is connect() on an instance.
  await p.connect()
  assert.equal(await p.isRunning(), true)
})

test('pause without memory: files kept, resume boots again', async () => {
  const p = await create({ metadata: { role: 'shelving' } })
  await p.files.write('/home/user/state.txt', 'kept', { metadata: { kept: 'yes' } })
  // The start time of PID 1 (the agent) tells one boot from the next.
  const boot = async (s) => (await s.commands.run("cut -d' ' -f22 /proc/1/stat")).stdout.trim()
  const before = await boot(p)
  // And so does the kernel's boot ID, which E2B's own tests compare.
  const bootID = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
  const idBefore = await bootID(p)
  const bg = await p.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  assert.equal(await p.pause({ keepMemory: false }), true)
  assert.equal(await p.pause({ keepMemory: false }), false, 'already paused')
  assert.equal((await p.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run } } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [p.sandboxId])
  // Another key cannot pause it, nor wake it.
  const other = { apiKey: process.env.E2B_TEST_OTHER_KEY }
  await assert.rejects(Sandbox.connect(p.sandboxId, other), SandboxNotFoundError)

  const back = await Sandbox.connect(p.sandboxId, { timeoutMs: 120_000 })
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/home/user/state.txt'), 'kept')
  assert.deepEqual((await back.files.getInfo('/home/user/state.txt')).metadata, { kept: 'yes' })
  assert.notEqual(await boot(back), before, 'a new boot')
  assert.notEqual(await bootID(back), idBefore, 'a new boot ID')
  assert.ok(!(await back.commands.list()).some((x) => x.pid === bg.pid), 'processes ended with the pause')
  // Killed, it cannot be paused either way.
  await back.kill()
  await assert.rejects(Sandbox.pause(p.sandboxId, { keepMemory: false }), SandboxNotFoundError)
})

test('lifecycle: pause on timeout', async () => {
  const p = await create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
  assert.equal((await p.getInfo()).lifecycle.onTimeout, 'pause')
  await p.files.write('/home/user/kept.txt', 'kept')
  await waitFor(async () => (await p.getInfo()).state === 'paused', 'auto-pause on timeout')
  const back = await Sandbox.connect(p.sandboxId, { timeoutMs: 60_000 })
  assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
  // Without memory: the files stay, the processes do not.
  const f = await create({ timeoutMs: 2_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await f.files.write('/home/user/kept.txt', 'kept')
  const bg = await f.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  await waitFor(async () => (await f.getInfo()).state === 'paused', 'pause without memory on timeout')
  const fback = await Sandbox.connect(f.sandboxId, { timeoutMs: 60_000 })
  assert.equal(await fback.files.read('/home/user/kept.txt'), 'kept')
  assert.ok(!(await fback.commands.list()).some((x) => x.pid === bg.pid), 'processes ended with the pause')
  // A killing sandbox is gone after its timeout.
  const k = await create({ timeoutMs: 1_000 })
  await waitFor(async () => !(await Sandbox.list({ query: { metadata: { run } } }).nextItems()).some((s) => s.sandboxId === k.sandboxId), 'kill on timeout')
})

test('list: metadata filter and pagination', async () => {
  const other = await create({ metadata: { role: 'other' } })
  const mine = await Sandbox.list({ query: { metadata: { run, role: 'other' } } }).nextItems()
  assert.deepEqual(mine.map((s) => s.sandboxId), [other.sandboxId])
  assert.equal(mine[0].metadata.role, 'other')
  assert.equal(mine[0].state, 'running')

  const pager = Sandbox.list({ query: { metadata: { run } }, limit: 1 })
  const seen = []
  for (let pages = 0; pager.hasNext; pages++) {
    assert.ok(pages < 20, 'pagination does not end')
    const page = await pager.nextItems()
    assert.ok(page.length <= 1)
    seen.push(...page.map((s) => s.sandboxId))
  }
  assert.equal(new Set(seen).size, seen.length, 'no sandbox twice')
  assert.ok(seen.includes(sbx.sandboxId) && seen.includes(other.sandboxId), seen.join(' '))
})

test('snapshots and fork', async () => {
  await sbx.files.write('/home/user/snap.txt', 'in snapshot', { metadata: { snap: 'yes' } })
  const snap = await sbx.createSnapshot({ name: `snap-${run}` })
  assert.match(snap.snapshotId, /^[a-z0-9]{20}$/)
  assert.deepEqual(snap.names, [`snap-${run}`])
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId))

  const fromSnap = await create({ template: snap.snapshotId })
  assert.equal(await fromSnap.files.read('/home/user/snap.txt'), 'in snapshot')
  assert.deepEqual((await fromSnap.files.getInfo('/home/user/snap.txt')).metadata, { snap: 'yes' })
  await fromSnap.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)

  const [child] = await sbx.fork({ count: 1, timeoutMs: 120_000 })
  assert.ok(child instanceof Sandbox, String(child))
  created.push(child)
  assert.equal(await child.files.read('/home/user/snap.txt'), 'in snapshot')
  assert.deepEqual((await child.files.getInfo('/home/user/snap.txt')).metadata, { snap: 'yes' })
  assert.notEqual(child.sandboxId, sbx.sandboxId)
})

test('errors: unknown template, wrong key, killed sandbox', async () => {
  await assert.rejects(Sandbox.create('no-such-template'), (e) => /404/.test(e.message) || e instanceof NotFoundError)
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_0123456789abcdef' }), AuthenticationError)
  await assert.rejects(Sandbox.list({ apiKey: 'atoll_nope' }).nextItems(), AuthenticationError)
  // The same key in E2B's format (the Python SDK insists on it) works.
  const e2bKey = 'e2b_' + process.env.E2B_API_KEY.replace(/^atoll_/, '')
  await Sandbox.list({ apiKey: e2bKey }).nextItems()

  const k = await create()
  assert.equal(await k.kill(), true)
  assert.equal(await k.kill(), false)
  assert.equal(await Sandbox.kill('notasandbox'), false)
  await assert.rejects(k.getInfo(), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(k.sandboxId), SandboxNotFoundError)
  assert.equal(await k.isRunning(), false)
  await assert.rejects(k.commands.run('true'))
  await assert.rejects(k.files.read('/etc/hostname'))
})

// getThrough sends GET path to sandbox port `port` the two ways a user of
// E2B's SDK can: to E2B_SANDBOX_URL with E2B's routing headers, and by the
// host getHost() names (connecting to atoll's listener, as a resolver for
// *.localhost would).
async function getByHeaders(sandbox, port, path, headers = {}) {
  const res = await fetch(process.env.E2B_SANDBOX_URL + path, {
    headers: { 'E2b-Sandbox-Id': sandbox.sandboxId, 'E2b-Sandbox-Port': String(port), ...headers },
  })
  return { status: res.status, body: await res.text() }
}
function getByHost(host, path, headers = {}) {
  const u = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.get({ host: u.hostname, port: u.port, path, headers: { host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
  })
}
// getHTTPS fetches https://{host}{path}, as E2B code does with getHost(),
// from atoll's HTTPS listener (its port in host), connecting to loopback
// as a resolver for *.localhost would; the certificate must verify for
// host against the server's CA (NODE_EXTRA_CA_CERTS).
function getHTTPS(host, path, headers = {}) {
  const u = new URL(`https://${host}`)
  return new Promise((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port: u.port, servername: u.hostname, path, headers: { host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
  })
}
async function serveHTTP(sandbox, port, text) {
  await sandbox.files.write('/home/user/www/index.html', text)
  await sandbox.commands.run(`python3 -m http.server ${port} --directory /home/user/www`, { background: true, timeoutMs: 0 })
}

test('getHost: a server in the sandbox, public as E2B has it by default', async () => {
  const web = await create()
  assert.equal(web.trafficAccessToken, undefined)
  await serveHTTP(web, 8000, 'hello from the sandbox')
  const host = web.getHost(8000)
  assert.equal(host, `8000-${web.sandboxId}.${process.env.E2B_DOMAIN}`)
  const r = await waitFor(async () => { const r = await getByHeaders(web, 8000, '/index.html'); return r.status === 200 && r }, 'the server in the sandbox')
  assert.equal(r.body, 'hello from the sandbox')
  const byHost = await getByHost(host, '/index.html')
  assert.equal(byHost.status, 200)
  assert.equal(byHost.body, 'hello from the sandbox')
  const tls = await getHTTPS(host, '/index.html')
  assert.equal(tls.status, 200)
  assert.equal(tls.body, 'hello from the sandbox')
  assert.equal((await web.getInfo()).network.allowPublicTraffic, true)
  // Nothing listens on 8001: E2B's proxy answers this, in these words.
  const closed = await getByHeaders(web, 8001, '/')
  assert.equal(closed.status, 502)
  assert.deepEqual(JSON.parse(closed.body), { code: 502, message: 'The sandbox is running but port is not open', sandboxId: web.sandboxId, port: 8001 })
  // And this once the sandbox is killed.
  await web.kill()
  for (const r of [await getByHeaders(web, 8000, '/index.html'), await getByHost(host, '/index.html')]) {
    assert.equal(r.status, 502)
    assert.deepEqual(JSON.parse(r.body), { code: 502, message: 'The sandbox was not found', sandboxId: web.sandboxId })
  }
})

test('lifecycle autoResume: traffic to a port or envd wakes a paused sandbox', async () => {
  const web = await create({ timeoutMs: 4_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  assert.deepEqual((await web.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
  await serveHTTP(web, 8000, 'awake')
  const host = web.getHost(8000)
  await waitFor(async () => (await getByHost(host, '/index.html')).status === 200, 'the server in the sandbox')
  // Its timeout pauses it (memory kept); a request to its port waits for
  // the resume and is answered by the server that ran before.
  await waitFor(async () => (await Sandbox.getInfo(web.sandboxId)).state === 'paused', 'pause on timeout')
  const r = await getHTTPS(host, '/index.html')
  assert.deepEqual(r, { status: 200, body: 'awake' })
  assert.equal((await web.getInfo()).state, 'running')
  // So does envd: a command in an explicitly paused sandbox.
  assert.equal(await web.pause(), true)
  assert.equal((await web.commands.run('echo hi')).stdout, 'hi\n')
  assert.equal((await web.getInfo()).state, 'running')
  // Without autoResume a paused sandbox's port stays unreachable.
  const plain = await create({ lifecycle: { onTimeout: 'pause' } })
  await serveHTTP(plain, 8000, 'plain')
  await waitFor(async () => (await getByHost(plain.getHost(8000), '/index.html')).status === 200, 'the plain server')
  assert.equal(await plain.pause(), true)
  assert.equal((await getByHost(plain.getHost(8000), '/index.html')).status, 502)
  assert.equal((await plain.getInfo()).state, 'paused')
  // (A killed one wakes nothing: TestAutoResumeEndToEnd. Killing here would
  // free an address the next test's sandbox may take.)
})

test('getHost: allowPublicTraffic false needs the traffic access token', async () => {
  const priv = await create({ network: { allowPublicTraffic: false } })
  assert.ok(priv.trafficAccessToken, 'create answers a traffic access token')
  await serveHTTP(priv, 8000, 'private')
  const token = { 'e2b-traffic-access-token': priv.trafficAccessToken }
  await waitFor(async () => (await getByHeaders(priv, 8000, '/index.html', token)).status === 200, 'the private server')
  assert.equal((await getByHeaders(priv, 8000, '/index.html')).status, 403)
  assert.equal((await getByHeaders(priv, 8000, '/index.html', { 'e2b-traffic-access-token': 'wrong' })).status, 403)
  assert.equal((await getByHost(priv.getHost(8000), '/index.html')).status, 403)
  const ok = await getByHost(priv.getHost(8000), '/index.html', token)
  assert.equal(ok.status, 200)
  assert.equal(ok.body, 'private')
  // The token of one sandbox does not open another's ports.
  const pub = created.find((s) => s !== priv && !s.trafficAccessToken)
  assert.equal((await getByHeaders(priv, 8000, '/index.html', { 'e2b-traffic-access-token': pub.envdAccessToken })).status, 403)
  // Connect hands the token out again.
  assert.equal((await Sandbox.connect(priv.sandboxId)).trafficAccessToken, priv.trafficAccessToken)
})

// reaches tells whether a sandbox can fetch the test's internet server.
async function reaches(sandbox) {
  const py = `import urllib.request,sys
try:
    urllib.request.urlopen(sys.argv[1], timeout=3).read(); print("yes")
except Exception as e:
    print("no")`
  await sandbox.files.write('/home/user/reach.py', py)
  return (await sandbox.commands.run(`python3 /home/user/reach.py ${process.env.E2B_TEST_INTERNET_URL}`)).stdout.trim() === 'yes'
}

test('network: allowInternetAccess, allowOut, denyOut, updateNetwork', async () => {
  const inet = new URL(process.env.E2B_TEST_INTERNET_URL).hostname
  const open = await create()
  assert.equal(await reaches(open), true, 'a sandbox reaches the internet by default')
  assert.equal((await open.getInfo()).allowInternetAccess, true)

  const closed = await create({ allowInternetAccess: false })
  assert.equal(await reaches(closed), false, 'allowInternetAccess: false')
  const info = await closed.getInfo()
  assert.equal(info.allowInternetAccess, false)
  assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])

  await closed.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [inet] })
  assert.equal(await reaches(closed), true, 'allowOut opens the address')
  assert.deepEqual((await closed.getInfo()).network.allowOut, [inet])
  await closed.updateNetwork({ denyOut: [inet] })
  assert.equal(await reaches(closed), false, 'denyOut closes it')
  // E2B's allowOut wins over its denyOut.
  await closed.updateNetwork({ denyOut: [`${inet}/24`], allowOut: [inet] })
  assert.equal(await reaches(closed), true, 'allowOut inside a denied prefix')
  await closed.updateNetwork({})
  assert.equal(await reaches(closed), true, 'an empty update allows all')

  const listed = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [inet] } })
  assert.equal(await reaches(listed), true, 'an allow list at create')
  await assert.rejects(create({ network: { egressProxy: { address: 'proxy.example:1080' } } }), /egressProxy/)
  await assert.rejects(create({ network: { maskRequestHost: 'localhost:${PORT}' } }), /maskRequestHost/)
  await assert.rejects(create({ network: { denyOut: ['example.com'] } }), /denyOut/)
  await assert.rejects(Sandbox.updateNetwork('notasandbox', {}), SandboxNotFoundError)
})

test("tenants: another key's sandboxes are not found", async () => {
  const other = { apiKey: process.env.E2B_TEST_OTHER_KEY }
  assert.ok(other.apiKey, 'E2B_TEST_OTHER_KEY is set')
  const theirs = await Sandbox.create({ ...other, timeoutMs: 120_000, metadata: { run, role: 'theirs' } })
  created.push(theirs)
  const mine = await create({ metadata: { role: 'mine' } })

  // Each key lists only its own.
  const listedByMe = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
  assert.ok(listedByMe.some((s) => s.sandboxId === mine.sandboxId))
  assert.ok(!listedByMe.some((s) => s.sandboxId === theirs.sandboxId), 'my list shows their sandbox')
  const listedByThem = await Sandbox.list({ ...other, query: { metadata: { run } } }).nextItems()
  assert.deepEqual(listedByThem.map((s) => s.sandboxId), [theirs.sandboxId])

  // Their sandbox is unknown to me on every call, as E2B answers another team's.
  await assert.rejects(Sandbox.getInfo(theirs.sandboxId), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(theirs.sandboxId), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout(theirs.sandboxId, 60_000), SandboxNotFoundError)
  await assert.rejects(Sandbox.pause(theirs.sandboxId), SandboxNotFoundError)
  await assert.rejects(Sandbox.updateNetwork(theirs.sandboxId, {}), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(theirs.sandboxId), false)
  // ... and mine to them.
  await assert.rejects(Sandbox.getInfo(mine.sandboxId, other), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(mine.sandboxId, other), false)
  // Their sandbox still runs, for them.
  assert.equal((await Sandbox.getInfo(theirs.sandboxId, other)).state, 'running')
  assert.equal((await theirs.commands.run('echo still here')).stdout, 'still here\n')

  // Snapshots are the tenant's too.
  const snap = await theirs.createSnapshot({ name: `theirs-${run}` })
  assert.ok(!(await Sandbox.listSnapshots().nextItems()).some((s) => s.snapshotId === snap.snapshotId))
  await assert.rejects(Sandbox.create(snap.snapshotId), (e) => /404|not found/i.test(e.message))
  await assert.rejects(Sandbox.create(`theirs-${run}`), (e) => /404|not found/i.test(e.message))
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, other), true)
  assert.equal(await Sandbox.kill(theirs.sandboxId, other), true)
})
