// Runs E2B's code-interpreter SDK (@e2b/code-interpreter), unchanged,
// against atoll's code-interpreter template. cmd/atoll/codeinterp_e2e_test.go
// builds the template, starts `atoll serve` and runs this with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing at it; by hand:
//   E2B_API_URL=http://127.0.0.1:7400 E2B_SANDBOX_URL=http://127.0.0.1:7400 \
//   E2B_API_KEY=$(sudo cat /var/lib/atoll/api-key) node codeinterp.mjs
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { stripVTControlCharacters } from 'node:util'
import { Sandbox } from '@e2b/code-interpreter'

let sbx
before(async () => {
  // No template named: the SDK's default, code-interpreter-v1.
  const t0 = performance.now()
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
  const t1 = performance.now()
  const exec = await sbx.runCode('1+1')
  const t2 = performance.now()
  assert.equal(exec.text, '2')
  console.log(`create ${(t1 - t0).toFixed(0)} ms, first runCode ${(t2 - t1).toFixed(0)} ms`)
})
after(async () => {
  await sbx?.kill().catch(() => {})
})

test('the default template is atoll\'s code-interpreter template', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'code-interpreter')
  assert.equal(info.name, 'code-interpreter-v1')
})

test('state persists between calls of the default context', async () => {
  await sbx.runCode('x = 41\nimport math')
  const exec = await sbx.runCode('x + 1')
  assert.equal(exec.text, '42')
  assert.equal(exec.error, undefined)
  assert.ok(exec.executionCount >= 2, `executionCount ${exec.executionCount}`)
  assert.equal((await sbx.runCode('math.floor(x / 2)')).text, '20')
})

test('two contexts are apart; a context keeps its cwd', async () => {
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
  assert.equal(b.cwd, '/tmp')
  assert.equal(b.language, 'python')
  await sbx.runCode('y = "in a"', { context: a })
  assert.equal((await sbx.runCode('y', { context: a })).text, 'in a')
  const inB = await sbx.runCode('y', { context: b })
  assert.equal(inB.error?.name, 'NameError')
  assert.equal((await sbx.runCode('import os; os.getcwd()', { context: b })).text, '/tmp')
  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id), `contexts ${ids}`)
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === b.id))
  await assert.rejects(sbx.runCode('1', { context: b }), /not found/)
  await sbx.removeCodeContext(a.id)
})

test('stdout and stderr stream in order, as they are written', async () => {
  // Jupyter's kernel sends what a program wrote as it flushes, so one
  // print may come as two messages ("out 2", then "\n"), as from E2B's own
  // service: adjacent messages of one stream are joined before comparing.
  const seen = []
  const add = (stream, text) => {
    const last = seen.at(-1)
    if (last?.stream === stream) last.text += text
    else seen.push({ stream, text })
  }
  const code = [
    'import sys, time',
    'for i in range(3):',
    '    print(f"out {i}", flush=True)',
    '    print(f"err {i}", file=sys.stderr, flush=True)',
    '    time.sleep(0.2)',
  ].join('\n')
  const t0 = performance.now()
  let first
  const exec = await sbx.runCode(code, {
    onStdout: (m) => { first ??= performance.now() - t0; add('stdout', m.line) },
    onStderr: (m) => { add('stderr', m.line) },
  })
  assert.deepEqual(seen.map((m) => `${m.stream} ${m.text}`),
    ['stdout out 0\n', 'stderr err 0\n', 'stdout out 1\n', 'stderr err 1\n', 'stdout out 2\n', 'stderr err 2\n'])
  assert.equal(exec.logs.stdout.join(''), 'out 0\nout 1\nout 2\n')
  assert.equal(exec.logs.stderr.join(''), 'err 0\nerr 1\nerr 2\n')
  // Streamed: the first line came before the execution's 0.6 s were over.
  assert.ok(first < 500, `first stdout after ${first} ms`)
})

test('an exception comes back with its name, value and traceback', async () => {
  let called
  const exec = await sbx.runCode('def boom():\n    raise ValueError("no good")\n\nboom()', { onError: (e) => { called = e } })
  assert.equal(exec.error.name, 'ValueError')
  assert.equal(exec.error.value, 'no good')
  // IPython colours its tracebacks, as on E2B.
  const tb = stripVTControlCharacters(exec.error.traceback)
  assert.match(tb, /----> 4 boom\(\)/)
  assert.match(tb, /ValueError: no good/)
  assert.equal(called?.name, 'ValueError')
  assert.equal(exec.results.length, 0)
})

test('a matplotlib figure comes back as a PNG', async () => {
  const exec = await sbx.runCode([
    'import matplotlib.pyplot as plt',
    'plt.plot([1, 2, 3], [1, 4, 9])',
    'plt.title("squares")',
    'plt.show()',
  ].join('\n'))
  assert.equal(exec.error, undefined)
  const png = exec.results.find((r) => r.png)
  assert.ok(png, `results: ${JSON.stringify(exec.results.map((r) => r.formats()))}`)
  const bytes = Buffer.from(png.png, 'base64')
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
  assert.equal(bytes.subarray(12, 16).toString(), 'IHDR')
  const width = bytes.readUInt32BE(16), height = bytes.readUInt32BE(20)
  assert.ok(width > 100 && height > 100, `${width}x${height}`)
})

test('a pandas DataFrame comes back as HTML and text', async () => {
  const exec = await sbx.runCode('import pandas as pd\npd.DataFrame({"name": ["ada", "bob"], "score": [3, 5]})')
  assert.equal(exec.error, undefined)
  const r = exec.results[0]
  assert.ok(r.isMainResult)
  assert.match(r.html, /<table/)
  assert.match(r.html, /<td>ada<\/td>/)
  assert.match(r.text, /bob\s+5/)
})

test('rich results: markdown, svg, latex, json, html', async () => {
  const exec = await sbx.runCode([
    'from IPython.display import display, Markdown, SVG, Latex, JSON, HTML',
    'display(Markdown("# title"))',
    'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>\'))',
    'display(Latex(r"$x^2$"))',
    'display(JSON({"a": 1}))',
    'HTML("<b>bold</b>")',
  ].join('\n'))
  assert.equal(exec.error, undefined)
  const [md, svg, latex, json, html] = exec.results
  assert.equal(md.markdown, '# title')
  assert.match(svg.svg, /<svg/)
  assert.equal(latex.latex, '$x^2$')
  assert.deepEqual(json.json, { a: 1 })
  assert.equal(html.html, '<b>bold</b>')
  assert.ok(html.isMainResult && !md.isMainResult)
})

test('rich results: JPEG and PDF, each to onResult in order', async () => {
  const seen = []
  const exec = await sbx.runCode([
    'import io',
    'import matplotlib.pyplot as plt',
    'from IPython.display import display, Image',
    'fig = plt.figure(figsize=(2, 2))',
    'plt.plot([1, 2], [2, 1])',
    'buf = io.BytesIO()',
    'fig.savefig(buf, format="jpeg")',
    'plt.close(fig)',
    'display(Image(buf.getvalue(), format="jpeg"))',
    'class Doc:',
    '    def _repr_pdf_(self):',
    '        return b"%PDF-1.4\\n%%EOF\\n"',
    '    def __repr__(self):',
    '        return "a pdf"',
    'Doc()',
  ].join('\n'), { onResult: (r) => { seen.push(r) } })
  assert.equal(exec.error, undefined)
  const [jpeg, pdf] = exec.results
  assert.equal(exec.results.length, 2)
  const jb = Buffer.from(jpeg.jpeg, 'base64')
  // JPEG: SOI, then a marker; and its last two bytes are EOI.
  assert.deepEqual([...jb.subarray(0, 3)], [0xff, 0xd8, 0xff])
  assert.deepEqual([...jb.subarray(-2)], [0xff, 0xd9])
  assert.ok(!jpeg.isMainResult)
  assert.equal(Buffer.from(pdf.pdf, 'base64').toString(), '%PDF-1.4\n%%EOF\n')
  assert.equal(pdf.text, 'a pdf')
  assert.ok(pdf.isMainResult)
  // onResult got the same results, as they came.
  assert.deepEqual(seen.map((r) => r.formats()), [['jpeg'], ['pdf']])
  assert.equal(seen[0].jpeg, jpeg.jpeg)
  assert.equal(seen[1].pdf, pdf.pdf)
})

test('os.chdir holds between calls of one context', async () => {
  const ctx = await sbx.createCodeContext()
  await sbx.runCode('import os\nos.makedirs("/tmp/ci-cwd", exist_ok=True)\nos.chdir("/tmp/ci-cwd")', { context: ctx })
  assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp/ci-cwd')
  await sbx.runCode('open("here.txt", "w").write("x")', { context: ctx })
  assert.equal(await sbx.files.read('/tmp/ci-cwd/here.txt'), 'x')
  // The default context's directory is its own.
  assert.equal((await sbx.runCode('import os; os.getcwd()')).text, '/home/user')
  await sbx.removeCodeContext(ctx)
})

test('a timeout interrupts the execution and the context stays usable', async () => {
  await sbx.runCode('z = 7')
  const t0 = performance.now()
  await assert.rejects(sbx.runCode('while True:\n    pass', { timeoutMs: 2000 }), (e) => e.name === 'TimeoutError')
  assert.ok(performance.now() - t0 < 5000)
  const t1 = performance.now()
  const exec = await sbx.runCode('z * 6')
  assert.equal(exec.text, '42')
  assert.ok(performance.now() - t1 < 5000, `the next execution took ${performance.now() - t1} ms`)
})

test('restarting a context forgets its state', async () => {
  const ctx = await sbx.createCodeContext()
  await sbx.runCode('kept = 1', { context: ctx })
  await sbx.restartCodeContext(ctx)
  const exec = await sbx.runCode('kept', { context: ctx })
  assert.equal(exec.error?.name, 'NameError')
  assert.equal((await sbx.runCode('2 * 21', { context: ctx })).text, '42')
  await sbx.removeCodeContext(ctx)
})

test('a kernel that dies is replaced, its state lost', async () => {
  const ctx = await sbx.createCodeContext()
  await sbx.runCode('lost = 1', { context: ctx })
  const died = await sbx.runCode('import os; os._exit(1)', { context: ctx })
  assert.equal(died.error?.name, 'KernelDied')
  assert.equal((await sbx.runCode('lost', { context: ctx })).error?.name, 'NameError')
  assert.equal((await sbx.runCode('6 * 7', { context: ctx })).text, '42')
  await sbx.removeCodeContext(ctx)
})

test('envs hold for one execution', async () => {
  const exec = await sbx.runCode('import os; os.environ["GREETING"]', { envs: { GREETING: 'hello' } })
  assert.equal(exec.text, 'hello')
  assert.equal((await sbx.runCode('import os; os.environ.get("GREETING", "unset")')).text, 'unset')
})

test('bash keeps its variables and working directory', async () => {
  const one = await sbx.runCode('cd /tmp && N=20; echo "n is $N"; echo oops >&2', { language: 'bash' })
  assert.deepEqual(one.logs.stdout, ['n is 20\n'])
  assert.deepEqual(one.logs.stderr, ['oops\n'])
  const two = await sbx.runCode('echo $((N + 22)) $(pwd)', { language: 'bash' })
  assert.deepEqual(two.logs.stdout, ['42 /tmp\n'])
  const bad = await sbx.runCode('false', { language: 'bash' })
  assert.equal(bad.error?.value, 'exit status 1')
})

test('JavaScript and TypeScript run in deno\'s kernel', async () => {
  // E2B's names: js is javascript; ts, typescript.
  const one = await sbx.runCode('let n = 40\nconsole.log("hello from", "deno")\nn + 2', { language: 'js' })
  assert.equal(one.error, undefined, JSON.stringify(one.error))
  assert.deepEqual(one.logs.stdout, ['hello from deno\n'])
  assert.equal(one.text, '42')
  // State across calls of the default javascript context.
  const two = await sbx.runCode('n * 2', { language: 'javascript' })
  assert.equal(two.text, '80')
  // TypeScript, in a context of its own, with types.
  const ctx = await sbx.createCodeContext({ language: 'ts', cwd: '/tmp' })
  assert.equal(ctx.language, 'typescript')
  await sbx.runCode('interface P { x: number }\nconst p: P = { x: 6 }', { context: ctx })
  const three = await sbx.runCode('Deno.cwd() + " " + (p.x * 7)', { context: ctx })
  assert.equal(three.text, '"/tmp 42"')
  assert.equal((await sbx.runCode('typeof n', { context: ctx })).text, '"undefined"')
  // An exception is the execution's error.
  const bad = await sbx.runCode('throw new TypeError("no good")', { language: 'js' })
  assert.equal(bad.error?.name, 'TypeError')
  assert.match(bad.error?.value, /no good/)
  // envs hold for one execution.
  assert.equal((await sbx.runCode('Deno.env.get("GREETING")', { language: 'js', envs: { GREETING: 'hi' } })).text, '"hi"')
  assert.equal((await sbx.runCode('String(Deno.env.get("GREETING"))', { language: 'js' })).text, '"undefined"')
  await sbx.removeCodeContext(ctx)
  // Deno's kernel takes no interrupt: a timeout ends it, and the context
  // goes on with a new one, its state lost.
  await assert.rejects(sbx.runCode('while (true) {}', { language: 'js', timeoutMs: 2000 }), (e) => e.name === 'TimeoutError')
  assert.equal((await sbx.runCode('typeof n', { language: 'js' })).text, '"undefined"')
  assert.equal((await sbx.runCode('6 * 7', { language: 'js' })).text, '42')
})

test('the sandbox is an E2B sandbox as well: commands and files', async () => {
  await sbx.runCode('open("/tmp/from-python.txt", "w").write("written by python")')
  assert.equal(await sbx.files.read('/tmp/from-python.txt'), 'written by python')
  const r = await sbx.commands.run('python3 -c "import pandas; print(pandas.__version__)"')
  assert.match(r.stdout, /^\d+\.\d+/)
})
