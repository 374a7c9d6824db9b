//! `include/distspmm.h` is generated from `capi/src` by cbindgen and committed: this test
//! regenerates it and fails when the committed file differs (run with `DISTSPMM_BLESS=1` to
//! rewrite it), then compiles the header as C99 and C++11 with warnings as errors.

mod common;

use std::path::Path;
use std::process::Command;

fn generate() -> String {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("read capi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen parses capi/src");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

#[test]
fn committed_header_is_current() {
    let path = common::repo_root().join("include/distspmm.h");
    let fresh = generate();
    if std::env::var_os("DISTSPMM_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Atomically, so a concurrently running compile test never reads half a header.
        let tmp = path.with_extension("h.tmp");
        std::fs::write(&tmp, &fresh).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        eprintln!("rewrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let line = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is out of date (first difference at line {}); regenerate it with\n  \
             DISTSPMM_BLESS=1 cargo test -p distspmm-capi --test header\nand commit it",
            path.display(),
            line + 1
        );
    }
}

#[test]
fn every_declaration_is_documented_prefixed_and_ascii() {
    let header = generate();
    assert!(
        header.is_ascii(),
        "the header must be plain ASCII (portable to any compiler)"
    );
    let lines: Vec<&str> = header.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        let is_function = line.ends_with(");") && !line.starts_with(' ') && !line.starts_with('/');
        let declares = is_function
            || line.starts_with("typedef struct")
            || line.starts_with("#define DSP_")
            || line.starts_with("enum ");
        if !declares {
            continue;
        }
        assert!(
            i > 0 && lines[i - 1].starts_with("//"),
            "undocumented declaration in the header: {line}"
        );
        let name = if is_function {
            functions += 1;
            line.split('(')
                .next()
                .and_then(|head| head.split_whitespace().last())
        } else {
            line.split_whitespace()
                .nth(if line.starts_with("typedef") { 2 } else { 1 })
        };
        let name = name.unwrap_or_default().trim_start_matches('*');
        assert!(
            name.starts_with("dsp_") || name.starts_with("DSP_"),
            "a name without the dsp_ prefix: {line}"
        );
    }
    assert!(functions >= 20, "found only {functions} functions");
}

fn compile(compiler: &str, args: &[&str], source: &Path) {
    let Some(compiler) = common::tool(compiler) else {
        return;
    };
    let include = common::repo_root().join("include");
    let out = Command::new(&compiler)
        .args(args)
        .arg("-I")
        .arg(&include)
        .args(["-fsyntax-only"])
        .arg(source)
        .output()
        .expect("run the compiler");
    assert!(
        out.status.success(),
        "{} {args:?} rejects the header:\n{}",
        compiler.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c99_and_cxx11() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("h.c");
    std::fs::write(&c, "#include <distspmm.h>\nint main(void) { return dsp_version() == DSP_VERSION_NUMBER ? 0 : 1; }\n").unwrap();
    let cxx = dir.path().join("h.cpp");
    std::fs::write(&cxx, "#include <distspmm.h>\nint main() { return dsp_version() == DSP_VERSION_NUMBER ? 0 : 1; }\n").unwrap();
    let strict = ["-Wall", "-Wextra", "-Werror", "-pedantic"];
    compile("cc", &[&["-std=c99"][..], &strict].concat(), &c);
    compile("c++", &[&["-std=c++11"][..], &strict].concat(), &cxx);
}
