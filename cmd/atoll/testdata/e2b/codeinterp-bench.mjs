// Times @e2b/code-interpreter's first runCode after Sandbox.create and a
// warm runCode('1+1'); `go run ./bench -only codeinterp` runs it against a
// server with the code-interpreter template. Prints {"create": [ms...],
// "first": [ms...], "warm": [ms...]} on stdout.
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... node codeinterp-bench.mjs [n]
import { Sandbox } from '@e2b/code-interpreter'
import { performance } from 'node:perf_hooks'

const n = Number(process.argv[2] || 10)
const create = []
const first = []
const warm = []
for (let i = 0; i < n; i++) {
  const t0 = performance.now()
  const s = await Sandbox.create({ timeoutMs: 300_000 })
  const t1 = performance.now()
  const e = await s.runCode('1+1')
  if (e.text !== '2') throw new Error(`runCode('1+1') gave ${JSON.stringify(e)}`)
  create.push(t1 - t0)
  first.push(performance.now() - t1)
  if (i === n - 1) {
    for (let j = 0; j < 5; j++) await s.runCode('1+1')
    for (let j = 0; j < n * 10; j++) {
      const t = performance.now()
      await s.runCode('1+1')
      warm.push(performance.now() - t)
    }
  }
  await s.kill()
}
console.log(JSON.stringify({ create, first, warm }))
