"""Test scaffolds in one driver: `mode` = solve | crash | hang | garbage.

solve: one chat call through the episode's proxy URL, then writes the cookbook's hello.txt
through the gateway (so the verifier gives 1). crash: exits 3. hang: starts a child and sleeps
forever (both must be killed). garbage: prints noise and leaves a result that is not JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

from _stacx_episode import GatewayShell, load_spec, write_result


def chat(spec: dict) -> str:
    body = {
        "model": spec["model_name"],
        "messages": [{"role": "user", "content": spec["instruction"]}],
        "max_tokens": spec["max_new_tokens"],
        "temperature": spec["temperature"],
    }
    request = urllib.request.Request(
        spec["model_base_url"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + spec["api_key"]},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"] or ""


def main() -> None:
    spec = load_spec()
    mode = spec["options"]["mode"]
    chat(spec)
    if mode == "solve":
        GatewayShell(spec).run("printf 'Hello, world!' > /app/hello.txt")
        write_result(spec, {"exit_status": "Submitted", "num_steps": 1})
    elif mode == "crash":
        print("scaffold blew up", flush=True)
        sys.exit(3)
    elif mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(spec["options"]["pid_file"], "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    else:
        print("\x00\xff not json {{{", flush=True)
        with open(spec["result_path"], "w") as f:
            f.write("<<garbage>> {not: json")


if __name__ == "__main__":
    main()
