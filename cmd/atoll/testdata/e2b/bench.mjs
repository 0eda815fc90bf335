// Times Sandbox.create and commands.run('true') through the official e2b
// SDK; `go run ./bench -only e2b` runs it beside atoll's Go SDK. Prints
// {"create": [ms...], "run": [ms...]} on stdout.
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... node bench.mjs [n]
import { Sandbox } from 'e2b'
import { performance } from 'node:perf_hooks'

const n = Number(process.argv[2] || 20)
const create = []
const run = []
// Warm up: the SDK's connections and modules.
await (await Sandbox.create({ timeoutMs: 300_000 })).kill()
for (let i = 0; i < n; i++) {
  const t0 = performance.now()
  const s = await Sandbox.create({ timeoutMs: 300_000, metadata: { bench: 'e2b' } })
  create.push(performance.now() - t0)
  await s.kill()
}
const s = await Sandbox.create({ timeoutMs: 300_000 })
for (let i = 0; i < 5; i++) await s.commands.run('true')
for (let i = 0; i < n * 5; i++) {
  const t0 = performance.now()
  await s.commands.run('true')
  run.push(performance.now() - t0)
}
await s.kill()
console.log(JSON.stringify({ create, run }))
