from harnessrl.cli import app

app(prog_name="harnessrl")
