// Builds templates with the official e2b SDK's Template API against atoll.
// cmd/atoll/e2b_template_test.go starts `atoll serve` and runs this with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (the admin's) pointing at it,
// and a second tenant's key in E2B_TEST_OTHER_KEY; by hand:
//   E2B_API_URL=http://127.0.0.1:7400 E2B_SANDBOX_URL=http://127.0.0.1:7400 \
//   E2B_API_KEY=$(sudo cat /var/lib/atoll/api-key) \
//   E2B_TEST_OTHER_KEY=$(sudo atoll key create --name other) node template.mjs
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, BuildError } from 'e2b'

const run = Date.now().toString(36)
const created = []
after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})
async function create(template) {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
  created.push(sbx)
  return sbx
}

// The files COPY steps upload, in a context directory of their own.
const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'atoll-template-'))
fs.writeFileSync(path.join(ctx, 'hello.txt'), `hello ${run}\n`)
fs.mkdirSync(path.join(ctx, 'dir/sub'), { recursive: true })
fs.writeFileSync(path.join(ctx, 'dir/a.txt'), 'a\n')
fs.writeFileSync(path.join(ctx, 'dir/sub/b.sh'), '#!/bin/sh\necho b\n', { mode: 0o755 })
fs.writeFileSync(path.join(ctx, 'dir/skip.md'), 'not copied by the glob\n')
after(() => fs.rmSync(ctx, { recursive: true, force: true }))

const app = `app-${run}`
const appTemplate = () => Template({ fileContextPath: ctx })
  .fromTemplate('base')
  .copy('hello.txt', '/opt/app/hello.txt')
  .copy('dir', '/opt/app/dir')
  .copy('dir/*.txt', 'txt/')
  .runCmd('cat /opt/app/hello.txt > copied && whoami > whoami') // in user's home
  .runCmd('touch /etc/by-root', { user: 'root' })
  .setEnvs({ GREETING: 'hi there' })
  .setWorkdir('/opt/work')
  .runCmd('pwd > here')
  .setStartCmd('echo started > /tmp/started; sleep 3600', 'test -f /tmp/started')

async function build(template, name, opts = {}) {
  const logs = []
  try {
    const info = await Template.build(template, name, { ...opts, onBuildLogs: (e) => logs.push(e.message) })
    return { info, logs: logs.join('\n') }
  } catch (e) {
    // The SDK replaces a BuildError's stack with the builder call's.
    throw new Error(`building ${name}: ${e.name}: ${e.message}\n${logs.join('\n')}`)
  }
}

test('Template.build: fromTemplate base, copy, runCmd, setEnvs, setWorkdir, setStartCmd; a sandbox of it', async () => {
  const { info, logs } = await build(appTemplate(), app)
  assert.equal(info.templateId, app)
  assert.match(info.buildId, /^[0-9a-f-]{36}$/)
  assert.match(logs, /Uploaded 'hello.txt'/)
  assert.match(logs, /RUN cat \/opt\/app\/hello.txt/)
  assert.match(logs, /Skipping upload|Uploaded 'dir\/\*.txt'/)

  const sbx = await create(app)
  assert.equal(await sbx.files.read('/opt/app/hello.txt'), `hello ${run}\n`)
  assert.equal(await sbx.files.read('/home/user/copied'), `hello ${run}\n`)
  assert.equal(await sbx.files.read('/opt/app/dir/a.txt'), 'a\n')
  assert.equal((await sbx.commands.run('/opt/app/dir/sub/b.sh')).stdout, 'b\n')
  // A glob copies the files it matches, into the user's home when relative.
  assert.equal(await sbx.files.read('/home/user/txt/a.txt'), 'a\n')
  assert.equal(await sbx.files.exists('/home/user/txt/skip.md'), false)
  // From E2B's base template steps run as user, and copies are theirs.
  assert.equal(await sbx.files.read('/home/user/whoami'), 'user\n')
  assert.equal((await sbx.files.getInfo('/opt/app/hello.txt')).owner, 'user')
  assert.equal(await sbx.files.exists('/etc/by-root'), true)
  assert.equal(await sbx.files.read('/opt/work/here'), '/opt/work\n')
  const env = await sbx.commands.run('echo "$GREETING"')
  assert.equal(env.stdout, 'hi there\n')
  // The start command ran, and create waited for the ready command.
  assert.equal(await sbx.files.read('/tmp/started'), 'started\n')
})

test('Template.build again: uploads skipped and steps cached; skipCache rebuilds', async () => {
  const again = await build(appTemplate(), app)
  assert.match(again.logs, /Skipping upload of 'hello.txt', already cached/)
  assert.match(again.logs, /CACHED .*RUN cat/)
  const forced = await build(appTemplate(), app, { skipCache: true })
  assert.doesNotMatch(forced.logs, /CACHED .*RUN cat/)
  const forced2 = await build(Template({ fileContextPath: ctx }).skipCache().fromTemplate('base').runCmd('echo once'), `${app}-forced`)
  const forced3 = await build(Template({ fileContextPath: ctx }).skipCache().fromTemplate('base').runCmd('echo once'), `${app}-forced`)
  assert.doesNotMatch(forced3.logs, /CACHED/)
  assert.match(forced2.logs, /once/)
  // forceUpload uploads the files again, and rebuilds the step.
  const up = () => Template({ fileContextPath: ctx }).fromTemplate('base').copy('hello.txt', '/tmp/h', { forceUpload: true })
  await build(up(), `${app}-upload`)
  const upAgain = await build(up(), `${app}-upload`)
  assert.match(upAgain.logs, /Uploaded 'hello.txt'/)
  assert.doesNotMatch(upAgain.logs, /CACHED/)
})

test('Template.buildInBackground and getBuildStatus; exists', async () => {
  const name = `bg-${run}`
  const t = Template({ fileContextPath: ctx }).fromBaseImage().runCmd('echo from-background; whoami')
  const info = await Template.buildInBackground(t, name)
  let st
  for (let i = 0; i < 600; i++) {
    st = await Template.getBuildStatus(info)
    if (st.status !== 'building' && st.status !== 'waiting') break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(st.status, 'ready', JSON.stringify(st.reason))
  assert.equal(st.buildID, info.buildId)
  const all = (await Template.getBuildStatus(info, { logsOffset: 0 })).logEntries.map((e) => e.message).join('\n')
  assert.match(all, /from-background\nroot/) // fromBaseImage: steps run as root, as on E2B
  const tail = await Template.getBuildStatus(info, { logsOffset: 100000 })
  assert.equal(tail.logEntries.length, 0)
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists('base'), true)
  assert.equal(await Template.exists(`nope-${run}`), false)
  const sbx = await create(name)
  assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')
})

test('a failing step: BuildError, status error with the logs and the step', async () => {
  const t = () => Template({ fileContextPath: ctx }).fromTemplate('base')
    .runCmd('echo fine')
    .runCmd('echo about-to-fail; exit 3')
  await assert.rejects(Template.build(t(), `fail-${run}`), (e) => {
    assert.ok(e instanceof BuildError, String(e))
    assert.equal(e.message, "failed to run command 'echo about-to-fail; exit 3': exit status 3") // E2B's words
    return true
  })
  const info = await Template.buildInBackground(t(), `fail-${run}`)
  let st
  for (let i = 0; i < 600; i++) {
    st = await Template.getBuildStatus(info)
    if (st.status === 'ready' || st.status === 'error') break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(st.status, 'error')
  assert.equal(st.reason.step, '2')
  assert.match(st.reason.message, /exit status 3/)
  assert.ok(st.reason.logEntries.some((e) => e.message === 'about-to-fail'))
  assert.equal(await Template.exists(`fail-${run}`), false)
})

test('tags: name:tag builds, assignTags, getTags, removeTags; a sandbox of a tag', async () => {
  const name = `tagged-${run}`
  const t = (v) => Template({ fileContextPath: ctx }).fromTemplate('base').runCmd(`echo ${v} > /home/user/v`)
  const v1 = await build(t('one'), `${name}:v1`)
  assert.deepEqual(v1.info.tags, ['v1'])
  const v2 = await build(t('two'), name, { tags: ['v2', 'stable'] })
  assert.deepEqual(v2.info.tags.sort(), ['stable', 'v2'])
  assert.equal(await (await create(`${name}:v1`)).files.read('/home/user/v'), 'one\n')
  assert.equal(await (await create(`${name}:stable`)).files.read('/home/user/v'), 'two\n')
  await assert.rejects(create(name)) // no default tag was built
  const assigned = await Template.assignTags(`${name}:v1`, ['default', 'prod'])
  assert.deepEqual(assigned.tags, ['default', 'prod'])
  assert.equal(assigned.buildId, v1.info.buildId)
  assert.equal(await (await create(name)).files.read('/home/user/v'), 'one\n')
  const tags = await Template.getTags(name)
  assert.deepEqual(tags.map((x) => x.tag).sort(), ['default', 'prod', 'stable', 'v1', 'v2'])
  assert.equal(tags.find((x) => x.tag === 'stable').buildId, v2.info.buildId)
  await Template.removeTags(name, 'prod')
  assert.deepEqual((await Template.getTags(name)).map((x) => x.tag).sort(), ['default', 'stable', 'v1', 'v2'])
  // FROM another template's tag.
  const child = await build(Template({ fileContextPath: ctx }).fromTemplate(`${name}:stable`).runCmd('cat /home/user/v > /home/user/w'), `child-${run}`)
  assert.equal(child.info.templateId, `child-${run}`)
  assert.equal(await (await create(`child-${run}`)).files.read('/home/user/w'), 'two\n')
})

test('only admin keys build', async () => {
  const t = Template({ fileContextPath: ctx }).fromTemplate('base').runCmd('true')
  await assert.rejects(Template.build(t, `other-${run}`, { apiKey: process.env.E2B_TEST_OTHER_KEY }), /admin key/)
  // Any key sees that templates exist: they are every tenant's.
  assert.equal(await Template.exists(app, { apiKey: process.env.E2B_TEST_OTHER_KEY }), true)
})

test('fromImage without a registry: a clear build error', async () => {
  const t = Template().fromImage(process.env.E2B_TEST_UNREACHABLE_IMAGE ?? '127.0.0.1:1/nothing/here:1').runCmd('true')
  await assert.rejects(Template.build(t, `img-${run}`), (e) => {
    assert.ok(e instanceof BuildError, String(e))
    assert.match(e.message, /importing image 127\.0\.0\.1:1\/nothing\/here:1/)
    return true
  })
})
