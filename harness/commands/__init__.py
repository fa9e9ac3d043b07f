"""The commands besides `run` and `step`, each a library function the CLI calls: `harness ab`
(`ab`, its arm specs `arms`), `harness check` (`check`), `harness init` (`initrepo`) and
`harness rerun` (`rerun`)."""
