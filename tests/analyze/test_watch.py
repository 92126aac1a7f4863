"""fpsim.watch on real training runs: it counts exactly, never changes the run, fails safely, checks arguments."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import fpsim
from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data, train

from analyze_helpers import assert_same, numpy_count


def small_model(seed: int = 0):
    torch.manual_seed(seed)
    return SensorNet(hidden=32, depth=3)


@pytest.fixture(scope="module")
def data():
    return sensor_data(samples=2048, seed=0)


def test_observation_does_not_change_training(data):
    plain = small_model()
    train(plain, data, 12, batch=128)
    observed = small_model()
    with watch(observed, every=1) as w:
        train(observed, data, 12, batch=128)
    assert w.step == 12 and w.steps_observed == 12
    for (name, a), (_, b) in zip(plain.state_dict().items(), observed.state_dict().items()):
        assert torch.equal(a, b), name


def test_histograms_equal_an_independent_count_of_the_same_tensors(data):
    model = small_model()
    layer = model.body[2]
    activations, grads = [], []
    hook = layer.register_forward_hook(lambda m, i, o: activations.append(o.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grab = opt.register_step_pre_hook(
        lambda o, a, k: grads.append(torch.cat([layer.weight.grad.reshape(-1), layer.bias.grad.reshape(-1)])))
    with watch(model, every=2) as w:
        for step in range(6):
            i = torch.arange(step * 64, step * 64 + 64)
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    hook.remove()
    grab.remove()
    stats = w.report().layer("body.2").tensors
    observed_activations = np.concatenate([a.numpy().ravel() for a in activations[0::2]])
    assert_same(stats["activation"].hist, numpy_count(observed_activations))
    assert stats["activation"].samples == 3
    assert stats["activation"].amax == np.abs(observed_activations).max()
    assert_same(stats["weight_grad"].hist, numpy_count(np.concatenate([g.numpy() for g in grads[0::2]])))


def test_sampling_every_n_steps_and_bounded_step_memory(data):
    model = small_model()
    with watch(model, every=3, step_capacity=8) as w:
        train(model, data, 40, batch=32)
    assert w.step == 40 and w.steps_observed == 14       # steps 0, 3, ..., 39
    store = w._store
    assert store.step_amax.numel() == 8 and store.steps_per_entry == 8
    report = w.report()
    assert report.layer("head").tensors["weight"].samples == 14
    rows_after = len(store.keys)
    with watch(model, every=3, step_capacity=8) as w2:
        train(model, data, 80, batch=32)
    assert len(w2._store.keys) == rows_after             # records do not grow with the run


def test_kinds_and_module_selection(data):
    model = small_model()
    with watch(model, kinds=("activation_grad",), modules=["body.0", nn.LayerNorm]) as w:
        train(model, data, 2, batch=32)
    report = w.report()
    assert sorted(layer.name for layer in report.layers if not layer.is_op) == ["body.0", "pressure_norm"]
    assert all(list(layer.tensors) == ["activation_grad"] for layer in report.layers)
    with watch(model, modules="leaves") as w:
        train(model, data, 1, batch=32)
    assert "body.1" in [layer.name for layer in w.report().layers]   # a Sigmoid


def test_bad_arguments_fail_before_training(data):
    model = small_model()
    with pytest.raises(ValueError, match=r"unknown format 'fp17'; allowed: .*fp16.*bf16"):
        watch(model, formats=("fp16", "fp17"))
    with pytest.raises(ValueError, match=r"no module named 'body.9'.*the modules are: .*body.0.*head"):
        watch(model, modules=["body.9"])
    with pytest.raises(ValueError, match=r"unknown tensor kind 'gradients'; allowed: activation, "):
        watch(model, kinds=("gradients",))
    with pytest.raises(ValueError, match="every must be a positive int"):
        watch(model, every=0)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        watch("model")
    with pytest.raises(TypeError, match="not a torch.nn.Module type"):
        watch(model, modules=[int])
    with pytest.raises(ValueError, match="underflow_threshold"):
        watch(model, underflow_threshold=2)


class Fragile(torch.Tensor):
    """A tensor subclass (as some libraries use) that raises when the hook asks it for its values (as a DTensor,
    for the part it holds)."""

    @property
    def _local_tensor(self):
        raise NotImplementedError("Fragile tensors do not give their local part")


class FragileOutput(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = SensorNet(hidden=32, depth=2)

    def forward(self, readings, pressure):
        return self.net(readings, pressure).as_subclass(Fragile)


def test_a_failing_hook_warns_once_detaches_and_training_goes_on(data):
    reference = FragileOutput()
    train(reference, data, 5, batch=64)
    model = FragileOutput()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch(model, modules="leaves") as w:        # "leaves" records the model's own output too
            train(model, data, 5, batch=64)
    ours = [c for c in caught if "fpsim.watch" in str(c.message)]
    assert len(ours) == 1 and "local part" in str(ours[0].message)
    assert w.observation_error and not w._handles
    for (name, a), (_, b) in zip(reference.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor)), name
    assert w.report().run["observation_error"].startswith("NotImplementedError")


@pytest.mark.parametrize("told", [True, False], ids=["optimizer_passed", "optimizer_found"])
def test_gradient_accumulation_counts_optimizer_steps(data, told):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=opt if told else None) as w:
        for step in range(3):
            for micro in range(4):
                i = torch.arange(micro * 16, micro * 16 + 16)
                loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]),
                                                   data["label"][i])
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert w.step == 3
    report = w.report()
    assert report.layer("head").tensors["activation"].samples == 12
    assert report.layer("head").tensors["update"].samples == 3


def test_gradient_accumulation_updated_by_hand_counts_updates(data):
    # micro-batches accumulate into .grad; p.data.add_ (no version bump) and zero_grad end a step at the next forward
    model = small_model()
    with watch(model) as w:
        for step in range(3):
            for micro in range(4):
                i = torch.arange(micro * 16, micro * 16 + 16)
                nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]),
                                            data["label"][i]).backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
            model.zero_grad()
    assert w.step == 3
    assert w.report().layer("head").tensors["activation"].samples == 12


def test_weights_and_updates_by_hand_are_counted_from_the_second_step(data):
    # step 0 ends at the next forward (only then is the update by hand known): weights and updates from step 1 on
    model = small_model()
    layer = model.body[0]
    weights, updates = [], []
    with watch(model, formats=("bf16",), kinds=("weight", "update")) as w:
        for step in range(4):
            i = torch.arange(step * 64, step * 64 + 64)
            model.zero_grad()
            nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i]).backward()
            before = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)]).clone()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-1e-3)
            if step:
                weights.append(before.numpy().astype(np.float64))
                updates.append(torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)])
                               .numpy().astype(np.float64) - weights[-1])
    stats = w.report().layer("body.0").tensors
    assert stats["weight"].samples == stats["update"].samples == 3
    weights, updates = np.concatenate(weights), np.concatenate(updates)
    _, e = np.frexp(np.abs(weights))
    ulp = np.ldexp(1.0, np.maximum(np.where(weights == 0, -126, e - 1), -126) - 7)   # bf16: emin -126, 7 bits
    assert stats["update"].lost_updates["bf16"] == int(((updates != 0) & (np.abs(updates) < ulp / 2)).sum()) > 0


def test_weights_stored_in_bf16_say_their_lost_updates_cannot_be_counted():
    # pure BF16 training: an update BF16 loses leaves the weight as it was, so the counted updates (the weight's
    # change) cannot show it. The run really loses updates (a nonzero gradient, an unchanged weight), while
    # the count of BF16's lost updates is 0: the report must say that its shares are lower bounds
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)).to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    unchanged, moved = 0, 0
    with watch(model, formats=("fp16", "bf16")) as w:
        for _ in range(5):
            x, y = torch.randn(32, 16, generator=g).to(torch.bfloat16), torch.randint(0, 4, (32,), generator=g)
            loss = nn.functional.cross_entropy(model(x).float(), y)
            optimizer.zero_grad()
            loss.backward()
            before = model[0].weight.detach().clone()
            optimizer.step()
            nonzero = model[0].weight.grad != 0
            unchanged += int((nonzero & (model[0].weight.detach() == before)).sum())
            moved += int(nonzero.sum())
    report = w.report()
    assert unchanged > 0.5 * moved                                  # most of the run's updates were lost
    assert report.layer("0").tensors["update"].lost_update_fraction(fpsim.analyze.FormatLimits.of("bf16")) == 0
    assert any(note.startswith("weights are stored in bfloat16") and "lower bounds" in note
               for note in report.run["notes"])
    assert "lower bounds" in report.summary_table()


def test_manual_steps_without_an_optimizer(data):
    model = small_model()
    with watch(model, kinds=("activation", "activation_grad")) as w:
        for step in range(3):
            loss = nn.functional.cross_entropy(model(data["readings"][:16], data["pressure"][:16]),
                                               data["label"][:16])
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            w.advance()
    assert w.step == 3 and w.report().layer("head").tensors["activation_grad"].samples == 3


def test_custom_format_and_public_names():
    assert fpsim.watch is watch
    model = small_model()
    custom = fpsim.Format(6, 5)
    data = sensor_data(samples=256)
    with fpsim.watch(model, formats=("fp16", custom)) as w:
        train(model, data, 2, batch=32)
    report = w.report()
    assert report.formats == ["fp16", custom.name]
    assert set(report.verdicts["head"]) == {"fp16", custom.name}


def test_lost_updates_match_an_independent_count(data):
    """An update is lost in format f when |u| < ulp_f(w) / 2, ulp_f(w) = 2^(max(floor(log2|w|), emin) - m)."""
    model = small_model()
    layer = model.body[0]
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    pairs = []
    before = {}

    def pre(o, a, k):
        before["w"] = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)]).clone()

    def post(o, a, k):
        now = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)])
        pairs.append((before["w"], now - before["w"]))

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    formats = ("fp16", "bf16", "e4m3", "e5m2")
    with watch(model, formats=formats, kinds=("update",)) as w:
        for step in range(4):
            i = torch.arange(step * 64, step * 64 + 64)
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    stats = w.report().layer("body.0").tensors["update"]
    weights = np.concatenate([p[0].numpy() for p in pairs]).astype(np.float64)
    updates = np.concatenate([p[1].numpy() for p in pairs]).astype(np.float64)
    nonzero = updates != 0
    for name in formats:
        fmt = fpsim.format(name)
        _, e = np.frexp(np.abs(weights))
        binade = np.where(weights == 0, fmt.emin, e - 1)
        ulp = np.ldexp(1.0, np.maximum(binade, fmt.emin) - fmt.man_bits)
        expected = int((nonzero & (np.abs(updates) < ulp / 2)).sum())
        assert stats.lost_updates[name] == expected, name
        # and it means what it says: w + u, rounded to the format, gives w back (ties apart)
        w_f = np.asarray(fpsim.quantize(weights, name), dtype=np.float64)
        same = np.asarray(fpsim.quantize(w_f + updates, name), dtype=np.float64) == w_f
        lost = nonzero & (np.abs(updates) < ulp / 2)
        agree = (same[nonzero] == lost[nonzero]).mean()
        assert agree > 0.97, (name, agree)
    assert stats.lost_update_fraction(fpsim.analyze.FormatLimits.of("bf16")) > \
        stats.lost_update_fraction(fpsim.analyze.FormatLimits.of("fp16"))


def _numpy_mass_l1(values: np.ndarray) -> np.ndarray:
    """Sum of |x| per float32 exponent field, by numpy (finite values; field 0 holds the subnormals)."""
    v = np.asarray(values, dtype=np.float32).ravel()
    v = v[np.isfinite(v)]
    field = (v.view(np.uint32) >> 23) & 0xFF
    out = np.zeros(256)
    np.add.at(out, field, np.abs(v.astype(np.float64)))
    return out


def test_weights_optimizer_gradients_and_updates_match_an_independent_count(data):
    """The optimizer-side records of every module (counted for all modules in one kernel call per kind) equal
    numpy's count of the same tensors, captured around each step: counts, samples, amax and mass."""
    model = small_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    layers = {"body.0": model.body[0], "pressure_norm": model.pressure_norm, "head": model.head}
    seen = {name: {"weight": [], "optimizer_grad": [], "update": []} for name in layers}
    before = {}

    def pre(o, a, k):
        for name, m in layers.items():
            before[name] = [p.detach().clone() for p in m.parameters()]

    def post(o, a, k):
        for name, m in layers.items():
            seen[name]["weight"] += [p.numpy().ravel() for p in before[name]]
            seen[name]["optimizer_grad"] += [p.grad.detach().numpy().ravel().copy() for p in m.parameters()]
            seen[name]["update"] += [(p.detach() - b).numpy().ravel() for p, b in zip(m.parameters(), before[name])]

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    with watch(model, kinds=("weight", "optimizer_grad", "update")) as w:
        for step in range(3):
            i = torch.arange(step * 64, step * 64 + 64)
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report()
    for name in layers:
        for kind, samples in (("weight", 3), ("optimizer_grad", 6), ("update", 3)):
            stats = report.layer(name).tensors[kind]
            values = np.concatenate(seen[name][kind])
            assert_same(stats.hist, numpy_count(values))
            assert stats.samples == samples, (name, kind)
            assert stats.amax == float(np.abs(values).max()), (name, kind)
            if kind != "update":      # updates carry no mass
                np.testing.assert_allclose(stats.mass.l1, _numpy_mass_l1(values), rtol=1e-12, atol=0)


def test_without_the_compiled_kernel_the_counts_and_mass_are_the_same(data, monkeypatch):
    """The torch path alone (as when no compiler was there at install) gives the same report."""
    import fpsim.analyze.histogram as histogram
    import fpsim.analyze.store as store

    def observed_run():
        model = small_model()
        with watch(model, every=2) as w:
            train(model, data, 4, batch=128)
        return w.report()

    with_kernel = observed_run()
    for module in (histogram, store):        # the modules that call the kernel
        monkeypatch.setattr(module, "_fasthist", None)
    without = observed_run()
    assert [layer.name for layer in without.layers] == [layer.name for layer in with_kernel.layers]
    for a, b in zip(with_kernel.layers, without.layers):
        assert set(a.tensors) == set(b.tensors), a.name
        for kind, t in a.tensors.items():
            u = b.tensors[kind]
            np.testing.assert_array_equal(t.hist.counts, u.hist.counts)
            assert t.amax == u.amax and t.samples == u.samples, (a.name, kind)
            if t.mass is not None:
                np.testing.assert_allclose(t.mass.l2, u.mass.l2, rtol=1e-9)
    assert without.to_dict()["layers"][0]["verdicts"] == with_kernel.to_dict()["layers"][0]["verdicts"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_updates_of_16_bit_weights_are_counted_from_their_exact_difference(dtype):
    # the update is after - before as the weights hold them, counted against the exact difference (float64:
    # exact for these), not that difference rounded to the weights' own 16-bit format
    torch.manual_seed(0)
    model = nn.Linear(64, 64).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    updates = []

    def flat():
        return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])

    opt.register_step_pre_hook(lambda *_: updates.append(-flat()))
    opt.register_step_post_hook(lambda *_: updates[-1].add_(flat()))
    with watch(model, formats=("fp16", "bf16")) as w:
        for _ in range(3):
            loss = (model(torch.randn(8, 64, dtype=dtype)) * 10).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    update = w.report().layer("Linear").tensors["update"]
    assert_same(update.hist, numpy_count(torch.cat(updates).numpy()))
    assert update.amax == torch.cat(updates).abs().max().item()


class Huge(nn.Module):
    """A float64 model whose output, finite, lies beyond float32's range."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x):
        return self.lin(x) * 1e200


def test_finite_float64_values_beyond_float32_are_not_reported_non_finite():
    # torch says every output is finite; the report must not name a first non-finite step, and building it
    # must not warn into the user's run
    torch.manual_seed(0)
    model = Huge()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with watch(model, formats=("fp16",), modules="all") as w:
        out = model(torch.randn(3, 4, dtype=torch.float64))
        assert torch.isfinite(out).all()
        opt.zero_grad()
        (out * 1e-200).sum().backward()
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = w.report()
        report.to_dict()
    activation = report.layer("Huge").tensors["activation"]
    assert activation.first_nonfinite_step is None and activation.hist.huge == 12


@pytest.mark.parametrize("options, error, words", [
    (dict(scale_range=(-32.5, 64)), ValueError, r"scale_range must be two ints .*got \(-32.5, 64\)"),
    (dict(shadow_every=1, shadow_scales=(0.5,)), ValueError, r"shadow_scales must be ints .*got \(0.5,\)"),
    (dict(shadow_scales=(0.5,)), ValueError, r"shadow_scales must be ints"),         # also when nothing is shadowed
    (dict(shadow_scales=()), ValueError, r"shadow_scales must hold 0"),
    (dict(shadow_numerics="fast"), ValueError, r"shadow_numerics must be one of 'emulated', 'autocast', got 'fast'"),
    (dict(recipe_max_elements=0), ValueError, r"recipe_max_elements must be a positive int, got 0"),
    (dict(out=123), TypeError, r"out must be a folder path \(str or os.PathLike\) or None, got int 123"),
    (dict(modules=[]), ValueError, r"modules is empty; give one of params, leaves, all"),
    (dict(modules=[nn.Conv2d]), ValueError, r"no module of type Conv2d in the model; its module types are: "),
], ids=["fractional_scale_range", "fractional_shadow_scale", "shadow_scale_unused", "no_shadow_scales",
        "numerics", "recipe_elements", "out_int", "no_modules", "absent_module_type"])
def test_bad_arguments_fail_at_watch_naming_the_value_and_what_is_allowed(options, error, words):
    # docs/analyzer.md: "Bad arguments fail at watch(...), before training starts". Before, these were
    # accepted: scale_range truncated to (-32, 64), shadow_scales (0.5,) to [0], out=123 failed only at the
    # block's end, and modules=[] or a type matching no module gave an empty report
    with pytest.raises(error, match=words) as raised:
        watch(small_model(), **options)
    if "modules" in options and options["modules"]:          # the types, as torch lists the model's modules
        assert str(raised.value).endswith(", ".join(sorted({type(m).__name__ for m in small_model().modules()})))


def test_an_out_that_is_an_existing_file_fails_at_watch(tmp_path):
    path = tmp_path / "report"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match="is an existing file, not a folder"):
        watch(small_model(), out=path)
    assert watch(small_model(), out=tmp_path / "new", scale_range=(np.int64(-8), 8), modules=[nn.Linear])


def _nested_sequential():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 2))


def _train_nested(model, steps: int = 2):
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = model(torch.randn(8, 6, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("inside", [False, True], ids=["alone", "inside_a_watch_of_the_whole_model"])
def test_a_watched_submodule_records_its_own_modules_named_as_torch_names_them(inside):
    # before: the modules around it were recorded too, under made-up names ('Sequential#2.0', 'Sequential#2.3'),
    # because the global module hooks named every module that ran while the watch was on as a new root
    plain = _nested_sequential()
    _train_nested(plain)
    model = _nested_sequential()
    outer = watch(model, formats=("fp16",)) if inside else None
    if outer is not None:
        outer.attach()
    with watch(model[2], formats=("fp16",), modules="all") as w:
        _train_nested(model)
    if outer is not None:
        outer.close()
        assert {layer.name for layer in outer.report().layers if not layer.is_op} == {"0", "2.0", "3"}
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    report = w.report()
    torch_names = {name or type(model[2]).__name__ for name, _ in model[2].named_modules()}
    assert {layer.name for layer in report.layers if not layer.is_op} == torch_names == {"Sequential", "0", "1"}
    assert report.layer("0").tensors["weight_grad"].samples == 4      # weight and bias, 2 steps
    assert {op.module for op in report.ops} == torch_names - {"Sequential"} | {"loop"}
    assert "loop:addmm" in {op.name for op in report.ops}             # the last Linear, outside the submodule
    assert w.step == 2 and report.run["model"] == "Sequential"


def test_a_module_added_to_the_watched_model_after_watch_gets_the_name_torch_gives_it():
    # modules outside the watched model are not recorded; one added to it while watched is its own, named as in
    # model.named_modules() (before: a root of its own, 'Linear')
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, formats=("fp16",)) as w:
        model.append(nn.Linear(4, 2))
        opt.add_param_group({"params": model[1].parameters()})
        for seed in range(2):
            _train_step(model, opt, seed)
    names = [layer.name for layer in w.report().layers if not layer.is_op]
    assert names == [name for name, module in model.named_modules() if isinstance(module, nn.Linear)] == ["0", "1"]
    assert w.report().layer("1").tensors["weight_grad"].samples == 4 and not w.tied


def _train_step(model, opt, seed: int):
    loss = model(torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
